import { expect, test } from '@playwright/test';

import { runByKeyboard } from './dashboard-helpers';

/**
 * A sweep's leaderboard in JupyterLab, as a user sees it. tests/browser/test_dashboard_browser.py
 * writes sweep-lab.ipynb into the server's root: cell 0 defines `falling_loss`, cell 1
 * starts a two-trial sweep over its learning rate, cell 2 waits for it, cell 3 attaches.
 */
test('the sweep leaderboard shows a row per trial and their curves', async ({
  page
}, testInfo) => {
  test.setTimeout(480_000);
  await page.goto('lab/tree/sweep-lab.ipynb?reset'); // this notebook alone, not the earlier specs' tabs
  const cells = page.locator('.jp-Notebook .jp-Cell');
  await expect(cells.first()).toBeVisible({ timeout: 120_000 });
  await runByKeyboard(cells, 0);
  await runByKeyboard(cells, 1);
  const output = cells.nth(1).locator('.jp-OutputArea');
  const live = output.locator('.tf-sweep'); // the widget; the summary (hidden) has a copy
  const header = live.locator('.tf-sweep-header');
  await expect(header).toContainText('running', { timeout: 240_000 });
  await expect(live.locator('tr.tf-trial')).toHaveCount(2, {
    timeout: 240_000
  });
  await expect(output.locator('.bk-Canvas canvas').first()).toBeVisible({
    timeout: 120_000
  });
  await output.screenshot({ path: testInfo.outputPath('sweep-running.png') });
  await expect(header).toContainText('sweep succeeded: 2/2 trials done', {
    timeout: 240_000
  });
  // best first: the smaller learning rate has the lower loss, and is highlighted
  const best = live.locator('tr.tf-trial').first();
  await expect(best).toContainText('0.01');
  await expect(best).toHaveAttribute('style', /background/);
  await expect(output).not.toContainText('Error displaying widget');
  // the static summary is in the cell, hidden while the live leaderboard shows
  await expect(output.locator('.trainfactory-summary')).toHaveCount(1);
  await expect(output.locator('.trainfactory-summary')).toBeHidden();
  await output.screenshot({ path: testInfo.outputPath('sweep-ended.png') });

  // The side panel: the sweep is one row; its button opens a row per trial, best first.
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('trainfactory:open-jobs')
  );
  const panel = page.locator('#jupyter-trainfactory-jobs');
  const expand = panel.locator('tr.jp-tf-row .jp-tf-expand').first();
  await expect(expand).toHaveText('\u25B8 2 trials', { timeout: 90_000 });
  await expand.click();
  const trials = panel.locator('tr.jp-tf-trial');
  await expect(trials).toHaveCount(2);
  await expect(trials.first()).toContainText('lr=0.01');
  await expect(trials.first().locator('.jp-tf-state')).toHaveText('SUCCEEDED');
  await expect(trials.first()).toContainText('loss 0.');
  await panel.screenshot({ path: testInfo.outputPath('panel-sweep.png') });

  // %train attach shows the leaderboard again in its own cell; the first cell's live
  // view closes and leaves its summary: the table and the best trial's curve
  await runByKeyboard(cells, 3);
  await expect(cells.nth(3).locator('.tf-sweep tr.tf-trial')).toHaveCount(2, {
    timeout: 120_000
  });
  const kept = output.locator('.trainfactory-summary');
  await expect(kept).toBeVisible({ timeout: 60_000 });
  await expect(kept).toContainText('sweep succeeded: 2/2 trials done');
  await expect(kept.locator('tr.tf-trial')).toHaveCount(2);
  await expect(kept.locator('img').first()).toBeVisible();
  await output.screenshot({ path: testInfo.outputPath('sweep-summary.png') });
});
