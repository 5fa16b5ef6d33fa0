// The agent's replies as Markdown (client-wasm/www/markdown.js), in headless
// Chromium at 390 × 844 on the real page: code fences with a Copy button that
// copies, lists, links (http, https, mailto only), HTML and script shown as
// text, and a reply streamed in chunks ending as the whole reply drawn at once.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 markdown.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh; the page loads it), Debian
// chromium, `npm ci` here. No bridge, no relay: the replies are fed to the
// page's conversation (window.thunderbolt.conversation) as the agent's chunks
// would be. The screenshot goes to client-wasm/e2e/artifacts/markdown.png.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { startServer } from "../serve.mjs";
import { ROOT, WAIT_MS, launchChromium } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 };

let server, browser, ctx, page, baseUrl;
const errors = [];

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  server = await startServer(0);
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  browser = await launchChromium();
  ctx = await browser.newContext({ ...PHONE, permissions: ["clipboard-read", "clipboard-write"] });
  page = await ctx.newPage();
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("dialog", (d) => {
    errors.push(`a dialog opened: ${d.message()}`);
    d.dismiss();
  });
  await page.goto(`${baseUrl}/www/`);
  await page.waitForFunction(() => window.thunderbolt && window.thunderbolt.conversation, null, { timeout: WAIT_MS });
  await page.evaluate(async () => {
    window.md = await import("/www/markdown.js");
    // A compact picture of a node's tree: `tag(children)`, text as "…".
    window.shape = (n) => [...n.childNodes].map((c) => (c.nodeType === 3
      ? JSON.stringify(c.data)
      : `${c.localName}(${window.shape(c)})`)).join(" ");
    // `text` drawn at once, in a detached element.
    window.whole = (text) => {
      const d = document.createElement("div");
      d.append(window.md.renderMarkdown(text));
      return d;
    };
    // The settings sheet out of the way: the conversation is what is looked at here.
    document.querySelector("#settings").open = false;
  });
});

after(async () => {
  await browser?.close();
  server?.close();
});

/// `text` drawn at once: its shape.
const shapeOf = (text) => page.evaluate((t) => window.shape(window.whole(t)), text);

/// A reply streamed into the page's conversation in `chunks`, its turn ended:
/// what `#reply` then is.
async function reply(prompt, chunks) {
  return page.evaluate(({ prompt, chunks }) => {
    const c = window.thunderbolt.conversation;
    const id = Math.floor(Math.random() * 1e9);
    c.startTurn(prompt, id);
    for (const ch of chunks) c.agentText(ch);
    c.endTurn(id, "end_turn");
    const r = document.querySelector("#reply");
    return { text: r.textContent, stop: r.dataset.stopReason, html: r.innerHTML, whole: window.whole(chunks.join("")).innerHTML };
  }, { prompt, chunks });
}

test("plain text stays exactly itself: textContent is the reply's text", async () => {
  for (const text of ["You said: hello; pid 123", "turn 2: second (history: first)", "snake_case_name and 2 * 3 * 4 and a_b", "a [bracket] and (parens) and a < b > c & d"]) {
    const r = await reply("plain", [text.slice(0, 5), text.slice(5)]);
    assert.equal(r.text, text);
    assert.equal(r.stop, "end_turn");
    assert.equal(r.html, r.whole);
  }
  // Lines stay lines (one paragraph, its line breaks kept and shown).
  const r = await reply("stream 3", ["chunk 1/3\n", "chunk 2/3\n", "chunk 3/3\n"]);
  assert.equal(r.text, "chunk 1/3\nchunk 2/3\nchunk 3/3");
  assert.equal(await shapeOf("chunk 1/3\nchunk 2/3\n"), 'p("chunk 1/3\\nchunk 2/3")');
  const shown = await page.evaluate(() => document.querySelector("#reply").innerText);
  assert.equal(shown, "chunk 1/3\nchunk 2/3\nchunk 3/3", "the line breaks are shown");
});

test("headings, paragraphs, emphasis, inline code and quotes", async () => {
  assert.equal(await shapeOf("# Title\n\nSome **bold**, *it*, _it too_, `a <b> c` and \\*not\\*.\n\n### Small ###\n> quoted\n> more\n\n---\n"),
    'h1("Title") p("Some " strong("bold") ", " em("it") ", " em("it too") ", " code("a <b> c") " and *not*.") h3("Small") blockquote(p("quoted\\nmore")) hr()');
  assert.equal(await shapeOf("***both*** and **bold *in* it** and `` a`b ``"),
    'p(em(strong("both")) " and " strong("bold " em("in") " it") " and " code("a`b"))');
  assert.equal(await shapeOf("#hashtag, 7 * 6, __init__ and file_name.rs"), 'p("#hashtag, 7 * 6, " strong("init") " and file_name.rs")');
  assert.equal(await shapeOf("para\n## Heading\ntext"), 'p("para") h2("Heading") p("text")');
});

test("lists: bullets, numbers, one level nested, loose and tight", async () => {
  assert.equal(await shapeOf("Steps:\n1. first\n2. second **now**\n   - nested a\n   - nested b\n3. third\n\n- one\n- two\n  continued\n* other kind"),
    'p("Steps:") ol(li("first") li("second " strong("now") ul(li("nested a") li("nested b"))) li("third")) ' +
    'ul(li("one") li("two\\ncontinued")) ul(li("other kind"))');
  assert.equal(await shapeOf("3) three\n4) four"), 'ol(li("three") li("four"))');
  assert.equal(await page.evaluate(() => window.whole("3) three\n4) four").firstChild.start), 3);
  assert.equal(await shapeOf("- a\n\n- b\n\n  more of b"), 'ul(li(p("a")) li(p("b") p("more of b")))');
  assert.equal(await shapeOf("- item\n  ```sh\n  make\n  ```"), 'ul(li("item" div(div(span("sh") button("Copy")) pre(code("make")))))');
  assert.equal(await shapeOf("- - -\n- x"), 'hr() ul(li("x"))');
});

test("links: http, https and mailto open in a new tab without opener; any other stays text", async () => {
  const text = "See [the **site**](https://example.com/a?b=1&c=(2)), [mail](mailto:me@example.com), [bad](javascript:alert(1)), " +
    "[bad too](JavaScript:alert(1)), [data](data:text/html,<script>alert(1)</script>), [rel](/relative) and [t](http://x.test \"title\").";
  const r = await reply("links", [text]);
  assert.equal(r.html, r.whole);
  const links = await page.evaluate(() => [...document.querySelectorAll("#reply a")].map((a) => ({ href: a.getAttribute("href"), rel: a.rel, target: a.target, text: a.textContent, html: a.innerHTML })));
  assert.deepEqual(links, [
    { href: "https://example.com/a?b=1&c=(2)", rel: "noopener noreferrer", target: "_blank", text: "the site", html: "the <strong>site</strong>" },
    { href: "mailto:me@example.com", rel: "noopener noreferrer", target: "_blank", text: "mail", html: "mail" },
    { href: "http://x.test/", rel: "noopener noreferrer", target: "_blank", text: "t", html: "t" },
  ]);
  for (const shown of ["[bad](javascript:alert(1))", "[bad too](JavaScript:alert(1))", "[data](data:text/html,<script>alert(1)</script>)", "[rel](/relative)"]) {
    assert.ok(r.text.includes(shown), `${shown} shown as text`);
  }
});

test("HTML and script from the agent show as text and make no element", async () => {
  const attack = [
    "<script>window.pwned = 1</script>",
    "<img src=x onerror=\"window.pwned = 2\">",
    "# <iframe src=\"javascript:window.pwned=3\"></iframe>",
    "> <b>bold?</b> <style>body{display:none}</style>",
    "- <svg onload=\"window.pwned=4\"></svg>",
    "[<img src=x onerror=window.pwned=5>](https://example.com)",
    "`<script>window.pwned=6</script>`",
    "```html\n<script>window.pwned = 7</script>\n```",
    "<a href=\"javascript:window.pwned=8\">click</a>",
  ].join("\n\n");
  const r = await reply("attack", [attack.slice(0, 40), attack.slice(40, 41), attack.slice(41)]);
  assert.equal(r.html, r.whole);
  const found = await page.evaluate(() => {
    const reply = document.querySelector("#reply");
    const tags = new Set([...reply.querySelectorAll("*")].map((e) => e.localName));
    const handlers = [...reply.querySelectorAll("*")].flatMap((e) => [...e.attributes].map((a) => a.name)).filter((n) => n.startsWith("on"));
    return { tags: [...tags].sort(), handlers, pwned: window.pwned, links: [...reply.querySelectorAll("a")].map((a) => a.href) };
  });
  assert.deepEqual(found.tags, ["a", "blockquote", "button", "code", "div", "h1", "li", "p", "pre", "span", "ul"]);
  assert.deepEqual(found.handlers, []);
  assert.equal(found.pwned, undefined);
  assert.deepEqual(found.links, ["https://example.com/"], "the one https link, its text the img tag as text");
  for (const part of ["<script>window.pwned = 1</script>", "<img src=x onerror=\"window.pwned = 2\">", "<iframe src=\"javascript:window.pwned=3\"></iframe>", "<b>bold?</b>", "<style>body{display:none}</style>", "<svg onload=\"window.pwned=4\"></svg>", "<script>window.pwned = 7</script>", "<a href=\"javascript:window.pwned=8\">click</a>"]) {
    assert.ok(r.text.includes(part), `${part} shown as text`);
  }
  assert.equal(errors.length, 0, errors.join("\n"));
});

test("a code fence: monospace, scrolls sideways, its Copy button copies the code and says Copied", async () => {
  const code = "cargo build --release --workspace --bins && ./target/release/thunderbolt iroh pair --json --app-url https://example.com\necho done";
  const r = await reply("build it", ["Run:\n\n``", "`sh\n", code.slice(0, 30), code.slice(30), "\n```\n\nThen **reload**."]);
  assert.equal(r.html, r.whole);
  const shown = page.locator("#reply");
  const block = await page.evaluate(() => {
    const pre = document.querySelector("#reply pre");
    const s = getComputedStyle(pre);
    const cs = getComputedStyle(pre.querySelector("code"));
    return { code: pre.textContent, font: cs.fontFamily, overflowX: s.overflowX, scrolls: pre.scrollWidth > pre.clientWidth,
      pageWidth: document.documentElement.scrollWidth, lang: document.querySelector("#reply .md-lang").textContent };
  });
  assert.equal(block.code, code);
  assert.match(block.font, /monospace/);
  assert.equal(block.overflowX, "auto");
  assert.ok(block.scrolls, "the long line scrolls inside the block");
  assert.ok(block.pageWidth <= 390, `the page itself does not scroll sideways (${block.pageWidth}px)`);
  assert.equal(block.lang, "sh");
  await shown.getByRole("button", { name: "Copy" }).click();
  await shown.getByRole("button", { name: "Copied" }).waitFor({ timeout: 5000 });
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), code);
  // Back to "Copy" after a while.
  await shown.getByRole("button", { name: "Copy" }).waitFor({ timeout: 5000 });
});

test("streaming: drawn on every growing prefix, each step the same DOM as that prefix drawn at once", async () => {
  const docs = [
    "# Plan\n\nI will:\n1. read `src/main.rs`\n2. fix the **bug**\n   - in `parse()`\n   - and *tests*\n\n```rust\nfn main() {\n    println!(\"hi\");\n}\n```\n\n> note: _careful_\n\nDone, see [docs](https://example.com/docs).\n",
    "Para one\nline two\n- a\n- b\n\n\n- c\n\n  c more\nlazy\n\n1. one\n\n2. two\n\n~~~\nunclosed fence\n- not a list\n",
    "1\n1.\n1. x\n\n* * *\n**bold *mixed** end*  ***x*** `tick ``double`` ` \\`esc\\` [l](https://a.test/(x)) [no](ftp://x)\n#\n## \n###### six ##\n",
  ];
  const result = await page.evaluate((docs) => {
    const out = [];
    let seed = 7;
    const rand = (n) => (seed = (seed * 1103515245 + 12345) % 2147483648) % n;
    for (const doc of docs) {
      // Every character one chunk, then chunks of random sizes.
      for (const sizes of [() => 1, () => 1 + rand(12)]) {
        const el = document.createElement("div");
        let n = 0;
        let bad = null;
        while (n < doc.length) {
          n = Math.min(doc.length, n + sizes());
          window.md.renderInto(el, doc.slice(0, n));
          if (!bad && el.innerHTML !== window.whole(doc.slice(0, n)).innerHTML) bad = { at: n, got: el.innerHTML, want: window.whole(doc.slice(0, n)).innerHTML };
        }
        out.push({ bad, same: el.innerHTML === window.whole(doc).innerHTML });
      }
    }
    // And 300 documents made of Markdown's pieces at random, in chunks of 1 to 5 characters.
    const pieces = ["- ", "* ", "1. ", "2) ", "\n", "\n", "\n\n", "  ", "   ", "```", "~~~", "> ", "# ", "### ", "**", "*", "_", "`",
      "[a](https://x.y)", "[b](", "](", ")", "word ", "x", "---", "\\", "<b>", "\t"];
    for (let d = 0; d < 300; d++) {
      let doc = "";
      while (doc.length < 160) doc += pieces[rand(pieces.length)];
      const el = document.createElement("div");
      let bad = null;
      for (let n = 0; n < doc.length; ) {
        n = Math.min(doc.length, n + 1 + rand(5));
        window.md.renderInto(el, doc.slice(0, n));
        if (!bad && el.innerHTML !== window.whole(doc.slice(0, n)).innerHTML) bad = { doc, at: n };
      }
      if (bad) {
        out.push({ bad, same: false });
        break;
      }
    }
    // Drawn blocks are kept: a block before the last two is the same node after more text came.
    const el = document.createElement("div");
    window.md.renderInto(el, "# one\n\npara\n\n- a\n");
    const first = el.firstChild;
    window.md.renderInto(el, "# one\n\npara\n\n- a\n- b\n\nmore");
    out.push({ kept: el.firstChild === first, shape: window.shape(el) });
    // Text that does not extend what was drawn: drawn afresh.
    window.md.renderInto(el, "other");
    out.push({ shape: window.shape(el) });
    return out;
  }, docs);
  for (const r of result.slice(0, -2)) {
    assert.equal(r.bad, null, JSON.stringify(r.bad));
    assert.ok(r.same);
  }
  assert.deepEqual(result.at(-2), { kept: true, shape: 'h1("one") p("para") ul(li("a") li("b")) p("more")' });
  assert.deepEqual(result.at(-1), { shape: 'p("other")' });
  // Through the page: chunks into the conversation's reply, as the agent sends them.
  const doc = docs[0];
  const chunks = doc.match(/[\s\S]{1,3}/g);
  const r = await reply("plan", chunks);
  assert.equal(r.html, r.whole);
});

test("a stored conversation keeps the raw text; drawn again from it, the same reply", async () => {
  const text = "Kept as written: **bold** and\n\n```js\nlet a = 1;\n```\n";
  const r = await page.evaluate(async (text) => {
    const c = window.thunderbolt.conversation;
    c.open("markdown-test-ticket");
    c.startTurn("keep it", 1);
    c.agentText(text.slice(0, 20));
    await new Promise(requestAnimationFrame);
    const streaming = document.querySelector("#reply").textContent;
    c.agentText(text.slice(20));
    c.endTurn(1, "end_turn");
    c.save();
    const before = document.querySelector("#reply").innerHTML;
    const stored = JSON.parse(localStorage.getItem("thunderbolt_iroh_conversation:markdown-test-ticket")).blocks.at(-1).reply;
    c.open("markdown-test-ticket", true);
    return { streaming, stored, same: document.querySelector("#reply").innerHTML === before };
  }, text);
  assert.equal(r.streaming, "Kept as written: **b", "drawn on the next frame, before the turn ended");
  assert.equal(r.stored, text);
  assert.ok(r.same);
});

test("a reply at 390 × 844: screenshot", async () => {
  await page.evaluate(() => {
    const c = window.thunderbolt.conversation;
    c.open("markdown-screenshot");
    c.startTurn("why does the build fail?", 1);
    const text = "## The build fails in `parse()`\n\nThe **config** parser reads the port as a *string*. Two fixes:\n\n" +
      "1. Parse it as a number:\n   - in `src/config.rs`\n   - with a test\n2. Reject a bad value early\n\n" +
      "```rust\nlet port: u16 = raw.parse().map_err(|e| Error::Port(format!(\"bad port {raw}: {e}\")))?;\n```\n\n" +
      "> Note: the old files still load.\n\nSee [the config docs](https://example.com/docs/config). " +
      "And this stays text: <script>alert(1)</script>\n";
    for (const ch of text.match(/[\s\S]{1,7}/g)) c.agentText(ch);
    c.endTurn(1, "end_turn");
    window.scrollTo(0, 0);
  });
  await page.screenshot({ path: join(ARTIFACTS, "markdown.png") });
  assert.equal(await page.evaluate(() => document.documentElement.scrollWidth), 390);
  assert.equal(errors.length, 0, errors.join("\n"));
});
