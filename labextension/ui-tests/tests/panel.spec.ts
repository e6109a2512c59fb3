import { expect, test } from '@jupyterlab/galata';

/** The job tests/test_panel_browser.py launched before starting this server. */
const JOB = process.env.TF_JOB_ID ?? '';

test('the panel shows a running job and stops it', async ({
  page
}, testInfo) => {
  expect(JOB).toMatch(/^tf-[0-9a-f]{8}$/);
  const hasCommand = await page.evaluate(() =>
    (window as any).jupyterapp.commands.hasCommand('trainfactory:open-jobs')
  );
  expect(hasCommand).toBe(true);
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('trainfactory:open-jobs')
  );
  const panel = page.locator('#jupyter-trainfactory-jobs');
  await expect(panel).toBeVisible();
  // Widen the sidebar, as a user would, so the screenshot shows the whole table.
  const handle = page
    .locator('#jp-main-split-panel > .lm-SplitPanel-handle')
    .first();
  const box = (await handle.boundingBox())!;
  expect(box).not.toBeNull();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(1250, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
  await expect(panel.locator('.jp-tf-services')).toContainText('MLflow UI', {
    timeout: 60000 // the server's first answer imports Ray and MLflow
  });

  const row = panel.locator(`tr[data-job-id="${JOB}"]`);
  const state = row.locator('.jp-tf-state');
  await expect(state).toHaveText('RUNNING', { timeout: 120000 });
  const throughput = row.locator('td').nth(3);
  await expect(throughput).toContainText('samples/s', { timeout: 120000 });
  await expect(row.locator('a[data-action="mlflow"]')).toHaveAttribute(
    'href',
    /trainfactory\/proxy\/mlflow\/#\/experiments\/\d+\/runs\/[0-9a-f]+$/
  );
  await panel.screenshot({ path: testInfo.outputPath('panel-running.png') });

  await row.locator('button[data-action="stop"]').click();
  const dialog = page.locator('.jp-Dialog');
  await expect(dialog).toContainText(JOB);
  await dialog.getByRole('button', { name: 'Stop after checkpoint' }).click();
  await expect(dialog).toHaveCount(0);

  await expect(state).toHaveText('STOPPED', { timeout: 150000 });
  await expect(row.locator('button[data-action="resume"]')).toBeVisible();
  await expect(row.locator('button[data-action="stop"]')).toHaveCount(0);
  await panel.screenshot({ path: testInfo.outputPath('panel-stopped.png') });
});
