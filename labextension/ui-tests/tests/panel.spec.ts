import { expect, test } from '@jupyterlab/galata';
import type { Locator, Page } from '@playwright/test';

/** The job tests/browser/test_panel_browser.py launched before starting this server. */
const JOB = process.env.TF_JOB_ID ?? '';
/** A second job it launched once the first ran: PENDING, short of the first's CPUs. */
const WAITING = process.env.TF_WAITING_JOB_ID ?? '';

/** Every column's key (columns.ts COLUMNS), and those shown at the sidebar's default width. */
const ALL = [
  'job',
  'state',
  'step',
  'throughput',
  'util',
  'cost',
  'ettr',
  'checkpoint',
  'restarts',
  'owner',
  'experiment',
  'started',
  'elapsed',
  'actions'
];
const NARROW = ['job', 'state', 'actions'];

/**
 * The keys of the columns the panel shows (its header cells that are visible). The panel
 * renders its table anew at each poll, and a table just replaced has no width: compare
 * with `expect.poll`, which reads it again.
 */
async function shownColumns(panel: Locator): Promise<string[]> {
  return panel
    .locator('th[data-column]')
    .evaluateAll(cells =>
      cells
        .filter(c => (c as HTMLElement).offsetWidth > 0)
        .map(c => (c as HTMLElement).dataset.column!)
    );
}

/** `control` lies wholly inside the panel, and the table box needs no horizontal scrolling. */
async function expectReachable(panel: Locator, control: Locator) {
  await expect(control).toBeInViewport({ ratio: 1 });
  const outer = (await panel.boundingBox())!;
  const inner = (await control.boundingBox())!;
  expect(inner.x).toBeGreaterThanOrEqual(outer.x);
  expect(inner.x + inner.width).toBeLessThanOrEqual(outer.x + outer.width);
  expect(inner.y).toBeGreaterThanOrEqual(outer.y);
  expect(inner.y + inner.height).toBeLessThanOrEqual(outer.y + outer.height);
  const box = await panel
    .locator('.jp-tf-table-box')
    .evaluate(b => [b.scrollLeft, b.scrollWidth, b.clientWidth]);
  expect(box[0]).toBe(0);
  expect(box[1]).toBeLessThanOrEqual(box[2]);
}

/** Drag the left sidebar's split handle to `x` (px from the page's left edge). */
async function dragSidebarTo(page: Page, x: number) {
  const handle = page
    .locator('#jp-main-split-panel > .lm-SplitPanel-handle')
    .first();
  const box = (await handle.boundingBox())!;
  expect(box).not.toBeNull();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(x, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
}

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
  await expect(panel.locator('.jp-tf-services')).toContainText('MLflow UI', {
    timeout: 60000 // the server's first answer imports Ray and MLflow
  });
  const row = panel.locator(`tr[data-job-id="${JOB}"]`);
  const state = row.locator('.jp-tf-state');
  await expect(state).toHaveText('RUNNING', { timeout: 120000 });

  // The second job waits for the first's CPUs: under its state, what it needs and who
  // holds it (its driver looks again every 5 s), the full reason in the tooltip. It is
  // stopped from the panel before it ever ran.
  expect(WAITING).toMatch(/^tf-[0-9a-f]{8}$/);
  const waitingRow = panel.locator(`tr[data-job-id="${WAITING}"]`);
  const waitingState = waitingRow.locator('.jp-tf-state');
  await expect(waitingState).toHaveText('PENDING', { timeout: 60000 });
  const waitingLine = waitingRow.locator('.jp-tf-waiting');
  await expect(waitingLine).toHaveText(`0 of 2 CPU free; held by job ${JOB}`, {
    timeout: 90000
  });
  await expect(waitingLine).toHaveAttribute(
    'title',
    /^waiting for resources: 2 workers x \(1 CPU\), placement pack; free now 0 of 2 CPU; held by job tf-/
  );
  await expect(waitingLine).toBeInViewport({ ratio: 1 });
  await expectReachable(
    panel,
    waitingRow.locator('button[data-action="stop"]')
  );
  await panel.screenshot({ path: testInfo.outputPath('panel-waiting.png') });
  await waitingRow.locator('button[data-action="stop"]').click();
  const waitingDialog = page.locator('.jp-Dialog');
  await expect(waitingDialog).toContainText(WAITING);
  await expect(waitingDialog).toContainText('has not started training');
  await waitingDialog
    .getByRole('button', { name: 'Stop', exact: true })
    .click();
  await expect(waitingDialog).toHaveCount(0);
  await expect(waitingState).toHaveText('STOPPED', { timeout: 90000 });
  await expect(waitingLine).toHaveCount(0);

  // It saved no checkpoint: Resume says first that it starts over as a new job.
  await waitingRow.locator('button[data-action="resume"]').click();
  const startOver = page.locator('.jp-Dialog');
  await expect(startOver).toContainText(`${WAITING}) saved no checkpoint`);
  await expect(startOver).toContainText('as a new job');
  await page.screenshot({ path: testInfo.outputPath('panel-start-over.png') });
  await startOver.getByRole('button', { name: 'Cancel' }).click();
  await expect(startOver).toHaveCount(0);
  await expect(waitingState).toHaveText('STOPPED'); // cancelled: nothing was asked

  // The reliability line under the table: the fleet's jobs of the last 30 days (this
  // one among them), per unit the failure rate and the exposure in its tooltip.
  const reliability = panel.locator('.jp-tf-reliability');
  await expect(reliability).toHaveText(
    /^reliability, last 30 days: (\d+ jobs? · .*ETTR|no jobs in the period)/,
    { timeout: 90000 } // it reads every run of the period
  );
  await expect(reliability).toBeInViewport({ ratio: 1 });
  const summary = (await reliability.textContent())!;
  console.log(`the reliability line: ${summary}`);
  if (summary.includes('ETTR')) {
    await expect(reliability).toHaveAttribute(
      'title',
      /started in the period\n.+: .+; exposure \S+ .+-days/
    );
  }
  await panel.screenshot({
    path: testInfo.outputPath('panel-reliability.png')
  });

  // The sidebar at its default width: Job, State (the step beneath it) and the actions,
  // all in view.
  const defaultWidth = (await panel.boundingBox())!.width;
  console.log(`the sidebar's default width: ${defaultWidth} px`);
  expect(defaultWidth).toBeLessThan(400);
  await expect.poll(() => shownColumns(panel)).toEqual(NARROW);
  await expectReachable(panel, row.locator('button[data-action="stop"]'));
  await expectReachable(panel, row.locator('a[data-action="mlflow"]'));
  await expect(row.locator('.jp-tf-col-state .jp-tf-step-under')).toHaveText(
    /^step \d/,
    { timeout: 120000 }
  );
  await expect(panel.locator('button[data-action="open-main"]')).toBeVisible();
  await panel.screenshot({ path: testInfo.outputPath('panel-default.png') });

  // Widened, as a user would: every column, the actions still at the right edge.
  const splitX = (await panel.boundingBox())!;
  await dragSidebarTo(page, 1250);
  expect((await panel.boundingBox())!.width).toBeGreaterThan(1100);
  await expect.poll(() => shownColumns(panel)).toEqual(ALL);
  const throughput = row.locator('td.jp-tf-col-throughput');
  await expect(throughput).toContainText('samples/s', { timeout: 120000 });
  await expect(row.locator('a[data-action="mlflow"]')).toHaveAttribute(
    'href',
    /trainfactory\/proxy\/mlflow\/#\/experiments\/\d+\/runs\/[0-9a-f]+\?workflowType=machine_learning$/ // the model-training view
  );
  await expect(row.locator('td.jp-tf-col-step')).toHaveText(/^\d/);
  await expect(row.locator('.jp-tf-step-under')).toBeHidden();
  await expectReachable(panel, row.locator('button[data-action="stop"]'));
  await panel.screenshot({ path: testInfo.outputPath('panel-wide.png') });

  // Opened in the main area (the sidebar back at its default width): every column.
  await dragSidebarTo(page, splitX.x + splitX.width);
  expect(
    Math.abs((await panel.boundingBox())!.width - defaultWidth)
  ).toBeLessThan(8);
  await panel.locator('button[data-action="open-main"]').click();
  const main = page.locator('#jupyter-trainfactory-jobs-main');
  await expect(main).toBeVisible();
  await expect(
    page.locator('.lm-DockPanel .lm-TabBar-tab.lm-mod-current')
  ).toContainText('Training jobs');
  await expect(
    main.locator(`tr[data-job-id="${JOB}"] .jp-tf-state`)
  ).toHaveText('RUNNING');
  await expect.poll(() => shownColumns(main)).toEqual(ALL);
  console.log(`the main area's width: ${(await main.boundingBox())!.width} px`);
  await expect(main.locator('button[data-action="open-main"]')).toBeHidden();
  await expect(
    main.locator(`tr[data-job-id="${JOB}"] [data-action="stop"] .jp-tf-label`)
  ).toHaveText('Stop');
  await main.screenshot({ path: testInfo.outputPath('panel-main.png') });
  await page.screenshot({ path: testInfo.outputPath('lab-main.png') });

  // Stopped from the sidebar at its default width.
  await row.locator('button[data-action="stop"]').click();
  const dialog = page.locator('.jp-Dialog');
  await expect(dialog).toContainText(JOB);
  await dialog.getByRole('button', { name: 'Stop after checkpoint' }).click();
  await expect(dialog).toHaveCount(0);

  await expect(state).toHaveText('STOPPED', { timeout: 150000 });
  await expect(row.locator('button[data-action="stop"]')).toHaveCount(0);
  await expectReachable(panel, row.locator('button[data-action="resume"]'));
  await expect(
    main.locator(`tr[data-job-id="${JOB}"] button[data-action="resume"]`)
  ).toBeVisible();
  await panel.screenshot({ path: testInfo.outputPath('panel-stopped.png') });
});
