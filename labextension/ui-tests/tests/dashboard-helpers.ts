import { expect } from '@playwright/test';
import type { Locator, Page } from '@playwright/test';

/** What the browser tests of the job dashboard share (dashboard*.spec.ts). */
const JOB_TIMEOUT = 240_000;

/** The most points any bokeh data source in the page holds (BokehJS's own documents). */
export async function browserPoints(page: Page): Promise<number> {
  return page.evaluate(() => {
    const bokeh = (window as any).Bokeh;
    let most = 0;
    for (const doc of bokeh?.documents ?? []) {
      for (const model of doc._all_models.values()) {
        const x = model.get_column?.('x');
        if (x) {
          most = Math.max(most, x.length);
        }
      }
    }
    return most;
  });
}

/** What a canvas shows now, as a PNG data URL. */
async function pixels(canvas: Locator): Promise<string> {
  return canvas.evaluate(c => (c as HTMLCanvasElement).toDataURL());
}

/** The step the dashboard's header shows (-1 before the first). */
async function headerStep(output: Locator): Promise<number> {
  const text = (await output.textContent()) ?? '';
  const match = text.match(/\bstep (\d+)/);
  return match ? Number(match[1]) : -1;
}

/** The dashboard draws, its plots move while the job runs, and it ends SUCCEEDED. */
export async function expectLiveDashboard(
  output: Locator,
  shot: (name: string) => Promise<unknown>
) {
  await expect(output).toContainText('RUNNING', { timeout: JOB_TIMEOUT });
  await expect
    .poll(() => headerStep(output), { timeout: JOB_TIMEOUT })
    .toBeGreaterThan(3);
  // the first plot is the user's first metric (the user section comes first)
  const canvas = output.locator('.bk-Canvas canvas').first();
  await expect(canvas).toBeVisible({ timeout: 60_000 });
  await expect(output).not.toContainText('javascript error');
  await expect(output).not.toContainText('Error displaying widget');
  const before = await pixels(canvas);
  await shot('running');
  await expect
    .poll(() => pixels(canvas), { timeout: 30_000, intervals: [1000] })
    .not.toBe(before);
  await expect(output).toContainText('SUCCEEDED', { timeout: JOB_TIMEOUT });
  await shot('ended');
}

/**
 * Run cell `i` of `cells` from the keyboard and wait until it ran. A page that has just
 * opened may still be connecting its kernel, which drops the request: it is sent again
 * while the prompt stays empty.
 */
export async function runByKeyboard(cells: Locator, i: number) {
  const prompt = cells.nth(i).locator('.jp-InputPrompt');
  for (let attempt = 0; attempt < 6; attempt++) {
    await cells.nth(i).locator('.jp-InputArea-editor').click();
    await cells.page().keyboard.press('Shift+Enter');
    try {
      await expect(prompt).toContainText(/\[(\d+|\*)\]/, { timeout: 15_000 });
      break;
    } catch {
      continue; // not taken yet
    }
  }
  await expect(prompt).toContainText(/\[\d+\]/, { timeout: 180_000 });
}
