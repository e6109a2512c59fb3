import { expect, test } from '@playwright/test';

import { expectLiveDashboard, runByKeyboard } from './dashboard-helpers';

/**
 * The job dashboard on Notebook 7's own page (not JupyterLab: plain Playwright, no Galata).
 * tests/browser/test_dashboard_browser.py writes dashboard-nb7.ipynb into the server's root: cell 0
 * defines `falling_loss` and `config`, cell 1 launches it.
 */
test('the dashboard draws live offline in Notebook 7', async ({
  page
}, testInfo) => {
  test.setTimeout(600_000);
  await page.goto('notebooks/dashboard-nb7.ipynb');
  await expect(page.locator('.jp-Notebook .jp-Cell').first()).toBeVisible({
    timeout: 60_000
  });
  await expect
    .poll(() => page.evaluate(() => (window as any).Bokeh?.version), {
      timeout: 60_000
    })
    .toBeTruthy();
  const cells = page.locator('.jp-Notebook .jp-Cell');
  for (const i of [0, 1]) {
    await runByKeyboard(cells, i);
  }
  const output = cells.nth(1).locator('.jp-OutputArea');
  await expectLiveDashboard(output, name =>
    output.screenshot({ path: testInfo.outputPath(`nb7-${name}.png`) })
  );
});
