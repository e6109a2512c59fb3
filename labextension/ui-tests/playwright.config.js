/**
 * Galata/Playwright configuration: Debian's chromium, no video or trace. The JupyterLab
 * server is started by tests/browser/test_panel_browser.py, which passes its URL in TARGET_URL.
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

module.exports = {
  ...baseConfig,
  retries: 0,
  workers: 1,
  timeout: 300000,
  reporter: [['list']],
  use: {
    ...baseConfig.use,
    baseURL: process.env.TARGET_URL || 'http://127.0.0.1:8888',
    viewport: { width: 1600, height: 900 },
    video: 'off',
    trace: 'off',
    screenshot: 'off',
    launchOptions: { executablePath: process.env.CHROMIUM || '/usr/bin/chromium' }
  }
};
