// The chat page as a person uses it, in headless Chromium (playwright-core):
//   node chat_page.mjs PAGE_URL SCREENSHOT.png
// Types a message, sees the answer stream in (an event a token: the page
// counts them), takes a screenshot; sends another and presses Stop.
import { chromium } from "playwright-core";

const [url, shot] = process.argv.slice(2);
const fail = (what) => { console.error(`chat_page: ${what}`); process.exit(1); };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent !== "…");
  await page.fill("#input", "Tell me a story");
  await page.press("#input", "Enter");
  await page.waitForSelector(".msg.assistant[data-done]", { timeout: 60000 });
  const answer = await page.textContent(".msg.assistant");
  const chunks = Number(await page.getAttribute(".msg.assistant", "data-chunks"));
  if (!answer || answer.length === 0) fail("no answer appeared");
  if (!(chunks >= 2)) fail(`the answer came in ${chunks} pieces, not streamed`);
  if ((await page.textContent(".msg.user")) !== "Tell me a story") fail("the user's message is not shown");
  if (!/tokens\/s/.test(await page.textContent("#speed"))) fail("no tokens/s shown");
  await page.screenshot({ path: shot });
  console.log(`chat_page: answer of ${answer.length} characters in ${chunks} pieces; screenshot ${shot}`);

  // Stop: the second answer stops growing, and Send works again.
  await page.fill("#input", "And another");
  await page.press("#input", "Enter");
  // (an answer may be empty: the random model may draw its end token first)
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".msg.assistant")[1];
    return a && (a.textContent.length > 0 || a.dataset.done);
  });
  // Pressed in the page in one step: the answer may end between a check and a click.
  const running = await page.evaluate(() => {
    const stop = document.getElementById("stop");
    const enabled = !stop.disabled;
    stop.click();
    return enabled;
  });
  await page.waitForFunction(() => !document.getElementById("send").disabled);
  const stopped = await page.evaluate(() => document.querySelectorAll(".msg.assistant")[1].textContent.length);
  await new Promise((r) => setTimeout(r, 300));
  const later = await page.evaluate(() => document.querySelectorAll(".msg.assistant")[1].textContent.length);
  if (later !== stopped) fail("the answer went on after Stop");
  if (await page.$(".msg.error")) fail(`an error is shown: ${await page.textContent(".msg.error")}`);
  console.log(`chat_page: ${running ? "stopped" : "finished before Stop"} at ${stopped} characters; ok`);
} finally {
  await browser.close();
}
