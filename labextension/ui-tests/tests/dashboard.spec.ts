import { expect, test } from '@jupyterlab/galata';
import type { IJupyterLabPageFixture } from '@jupyterlab/galata';
import type { BrowserContext, Page } from '@playwright/test';
import * as path from 'path';

import {
  browserPoints,
  expectLiveDashboard,
  runByKeyboard
} from './dashboard-helpers';

/**
 * The job dashboard in a real browser, as a user sees it. tests/browser/test_dashboard_browser.py
 * writes the notebooks into the server's root and starts the server; no CDN is reachable.
 *
 * dashboard-lab.ipynb: 0 defines `falling_loss` and `config`, 1 launches it, 2 waits for
 * it, 3 attaches to it again, 4 shows the reliability report of its experiment.
 */
const LAB_NOTEBOOK = 'dashboard-lab.ipynb';
/** Where tests/browser/test_dashboard_browser.py wrote them; each test uploads its own copy. */
const SOURCES = process.env.TF_NOTEBOOKS ?? '.';

/** A new page of `context` with JupyterLab open on `notebook` (a path on the server). */
async function openFresh(
  context: BrowserContext,
  notebook: string
): Promise<Page> {
  const fresh = await context.newPage();
  await fresh.goto(`lab/tree/${notebook}`);
  await expect(fresh.locator('.jp-Notebook .jp-Cell').first()).toBeVisible({
    timeout: 120_000
  });
  return fresh;
}

/** Upload `name` into this test's server folder; return its path on the server. */
async function upload(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  name: string
): Promise<string> {
  const target = `${tmpPath}/${name}`;
  expect(await page.contents.uploadFile(path.join(SOURCES, name), target)).toBe(
    true
  );
  return target;
}

// the notebooks stay on the server: tests/browser/test_dashboard_browser.py reads the saved one
test.use({ serverFiles: 'on' });

test.describe('job dashboard in JupyterLab', () => {
  test.setTimeout(600_000); // a job's start takes minutes on a loaded 2-core machine
  test('draws live offline, and again after a reload and an attach', async ({
    page,
    tmpPath
  }, testInfo) => {
    const messages: string[] = [];
    const offsite: string[] = [];
    page.on('console', m => messages.push(m.text()));
    page.on('request', r => {
      if (!new URL(r.url()).hostname.match(/^(127\.0\.0\.1|localhost)$/)) {
        offsite.push(r.url());
      }
    });
    const notebook = await upload(page, tmpPath, LAB_NOTEBOOK);
    await page.notebook.openByPath(notebook);
    await page.notebook.activate(LAB_NOTEBOOK);
    expect(
      await page.evaluate(() => (window as any).Bokeh?.version)
    ).toBeTruthy();
    await page.notebook.runCell(0);
    await page.notebook.runCell(1);
    const output = page.locator('.jp-Cell').nth(1).locator('.jp-OutputArea');
    await expectLiveDashboard(output, name =>
      output.screenshot({ path: testInfo.outputPath(`dashboard-${name}.png`) })
    );
    expect(messages.join('\n')).not.toContain('Failed to create view');
    // the static summary is there, and hidden while the live widget shows
    await expect(output.locator('.trainfactory-summary')).toHaveCount(1);
    await expect(output.locator('.trainfactory-summary')).toBeHidden();
    await page.notebook.runCell(2); // job.wait(): the notebook is up to date
    await page.notebook.save();

    // the tab reloaded (a new page of the same browser: Galata's own reload waits for
    // its Launcher): the kernel lives on, and attach draws the history with its points
    const again = await openFresh(page.context(), notebook);
    const cells = again.locator('.jp-Notebook .jp-Cell');
    await runByKeyboard(cells, 3);
    const attached = cells.nth(3).locator('.jp-OutputArea');
    await expect(attached.locator('.bk-Canvas canvas').first()).toBeVisible({
      timeout: 60_000
    });
    await expect(attached).toContainText('SUCCEEDED');
    await expect.poll(() => browserPoints(again)).toBeGreaterThan(10);
    await attached.screenshot({
      path: testInfo.outputPath('dashboard-attach.png')
    });
    // the fleet's reliability report over the experiment: its text and its plot
    await runByKeyboard(cells, 4);
    const report = cells.nth(4).locator('.jp-OutputArea');
    await expect(report).toContainText('reliability of jobs started', {
      timeout: 120_000
    });
    await expect(report).toContainText('ETTR:');
    await expect(report.locator('.bk-Canvas canvas').first()).toBeVisible({
      timeout: 60_000
    });
    await report.screenshot({ path: testInfo.outputPath('reliability.png') });
    await again.keyboard.press('Control+s');
    await expect(again.locator('.jp-mod-dirty')).toHaveCount(0);

    // without its kernel (reopened later, or shared), the cell keeps the summary
    const sessions = await (await again.request.get('api/sessions')).json();
    for (const session of sessions) {
      expect(
        (await again.request.delete(`api/kernels/${session.kernel.id}`)).ok()
      ).toBe(true);
    }
    await again.close();
    const later = await openFresh(page.context(), notebook);
    const kept = later
      .locator('.jp-Cell')
      .nth(1)
      .locator('.trainfactory-summary');
    await expect(kept).toBeVisible({ timeout: 60_000 });
    await expect(kept).toContainText('SUCCEEDED');
    await expect(kept.locator('img').first()).toBeVisible();
    await kept.screenshot({
      path: testInfo.outputPath('dashboard-summary.png')
    });
    expect(offsite).toEqual([]); // nothing from a CDN
  });
});
