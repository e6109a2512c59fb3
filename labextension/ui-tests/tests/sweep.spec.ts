import { expect, test } from '@playwright/test';

import { runByKeyboard } from './dashboard-helpers';

/**
 * A sweep's leaderboard in JupyterLab, as a user sees it. tests/test_dashboard_browser.py
 * writes sweep-lab.ipynb into the server's root: cell 0 defines `falling_loss`, cell 1
 * starts a two-trial sweep over its learning rate, cell 2 waits for it.
 */
test('the sweep leaderboard shows a row per trial and their curves', async ({
  page
}, testInfo) => {
  test.setTimeout(480_000);
  await page.goto('lab/tree/sweep-lab.ipynb');
  const cells = page.locator('.jp-Notebook .jp-Cell');
  await expect(cells.first()).toBeVisible({ timeout: 120_000 });
  await runByKeyboard(cells, 0);
  await runByKeyboard(cells, 1);
  const output = cells.nth(1).locator('.jp-OutputArea');
  const header = output.locator('.tf-sweep-header');
  await expect(header).toContainText('running', { timeout: 240_000 });
  await expect(output.locator('tr.tf-trial')).toHaveCount(2, {
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
  const best = output.locator('tr.tf-trial').first();
  await expect(best).toContainText('0.01');
  await expect(best).toHaveAttribute('style', /background/);
  await expect(output).not.toContainText('Error displaying widget');
  await output.screenshot({ path: testInfo.outputPath('sweep-ended.png') });
});
