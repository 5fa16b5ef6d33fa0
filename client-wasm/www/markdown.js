// The agent's replies as Markdown, made safe: every node is built with
// document.createElement and every piece of the agent's text goes in as a
// Text node, so whatever the agent (or a device in between) writes, HTML and
// script included, shows as text and never becomes an element of its own.
//
// What it knows (a subset of CommonMark, the part agents write):
// - paragraphs (a line break inside one stays a line break: the text keeps
//   its "\n" and the styles show it, `white-space: pre-line`);
// - headings `#` … `######`, a rule `---`;
// - fenced code ``` or ~~~ with an optional language, with a Copy button;
// - `inline code`, **bold** / __bold__, *italic* / _italic_, \-escapes;
// - lists `-`, `*`, `+` and `1.` / `1)`, nested (by indentation);
// - block quotes `>`;
// - links [text](url) for http:, https: and mailto: only (rel="noopener
//   noreferrer", target="_blank"); any other link stays as its source text.
// No raw HTML, no images, no tables: those show as the text they are.
//
// renderMarkdown(text) gives a DocumentFragment. renderInto(element, text)
// draws into an element and, when `text` extends what it drew there last (a
// reply streaming in), draws again only the last two top-level blocks: the
// blocks before them are final (a block's extent depends on its own lines and
// the one line after it), and keep their nodes.

/// How deep quotes and lists nest (deeper: shown as paragraphs).
const MAX_DEPTH = 8;
/// How deep emphasis and links nest (deeper: shown as text).
const INLINE_DEPTH = 16;
/// How far a link's text and destination may reach (a `[` with no end in sight is text).
const LINK_SPAN = 2000;

function h(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- blocks ----

const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$/;
const RULE = /^ {0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})$/;
const QUOTE = /^ {0,3}>/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;

const blank = (line) => /^[ \t]*$/.test(line);
const indentOf = (line) => line.length - line.trimStart().length;
/// Leading tabs as spaces (to the next multiple of 4), trailing "\r" gone.
function clean(line) {
  if (line.endsWith("\r")) line = line.slice(0, -1);
  if (!line.startsWith("\t") && !/^ +\t/.test(line)) return line;
  const ws = line.match(/^[ \t]*/)[0];
  let n = 0;
  for (const c of ws) n = c === "\t" ? n + 4 - (n % 4) : n + 1;
  return " ".repeat(n) + line.slice(ws.length);
}

function fenceOf(line) {
  const m = FENCE.exec(line);
  if (!m || (m[1][0] === "`" && m[2].includes("`"))) return null;
  const lang = m[2].trim().split(/\s+/)[0];
  return { ch: m[1][0], n: m[1].length, indent: indentOf(line), lang: /^[\w+#.-]{1,32}$/.test(lang) ? lang : "" };
}

function closesFence(line, f) {
  const m = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(line);
  return !!m && m[1][0] === f.ch && m[1].length >= f.n;
}

function itemOf(line) {
  if (RULE.test(line)) return null;
  const m = ITEM.exec(line);
  if (!m) return null;
  const indent = m[1].length;
  const marker = m[2];
  const content = m[4] ?? "";
  const spaces = m[3] ? m[3].replace(/\t/g, "    ").length : 0;
  const gap = content === "" || spaces > 4 ? 1 : spaces;
  const ordered = marker.length > 1 || /\d/.test(marker);
  return {
    indent, marker, ordered, content,
    delim: marker[marker.length - 1],
    num: ordered ? parseInt(marker, 10) : 1,
    contentIndent: indent + marker.length + gap,
  };
}

/// Whether `line` ends a paragraph above it (at nesting `depth`).
function interrupts(line, depth) {
  if (fenceOf(line) || HEADING.test(line) || RULE.test(line)) return true;
  if (depth >= MAX_DEPTH) return false;
  if (QUOTE.test(line)) return true;
  const it = itemOf(line);
  return !!it && it.content.trim() !== "" && (!it.ordered || it.num === 1);
}

/// The top-level blocks of `lines`: [{type, start, end (line indexes, end
/// excluded), …what it needs to be drawn}].
function split(lines, depth) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (blank(line)) {
      i++;
      continue;
    }
    const f = fenceOf(line);
    if (f) {
      const body = [];
      let j = i + 1;
      while (j < lines.length && !closesFence(lines[j], f)) {
        const l = lines[j];
        body.push(l.slice(Math.min(f.indent, indentOf(l))));
        j++;
      }
      const end = j < lines.length ? j + 1 : j;
      out.push({ type: "code", start: i, end, lang: f.lang, code: body.join("\n") });
      i = end;
      continue;
    }
    if (RULE.test(line)) {
      out.push({ type: "hr", start: i, end: i + 1 });
      i++;
      continue;
    }
    const hm = HEADING.exec(line);
    if (hm) {
      const text = (hm[2] || "").replace(/(^|[ \t]+)#+$/, "").trim();
      out.push({ type: "h", level: hm[1].length, start: i, end: i + 1, text });
      i++;
      continue;
    }
    if (depth < MAX_DEPTH && QUOTE.test(line)) {
      const body = [];
      let j = i;
      while (j < lines.length && QUOTE.test(lines[j])) body.push(clean(lines[j++].replace(/^ {0,3}> ?/, "")));
      out.push({ type: "quote", start: i, end: j, body });
      i = j;
      continue;
    }
    const first = depth < MAX_DEPTH && itemOf(line);
    if (first) {
      const list = splitList(lines, i, first);
      out.push(list);
      i = list.end;
      continue;
    }
    const body = [line.trim()];
    let j = i + 1;
    while (j < lines.length && !blank(lines[j]) && !interrupts(lines[j], depth)) body.push(lines[j++].trim());
    out.push({ type: "p", start: i, end: j, text: body.join("\n") });
    i = j;
  }
  return out;
}

/// A list from line `i` (its first item `first`): its items' lines, each
/// taken out of the item's indentation.
function splitList(lines, i, first) {
  const same = (it) => it.ordered === first.ordered && (it.ordered ? it.delim === first.delim : it.marker === first.marker);
  const items = [];
  let cur = null;
  let blanks = 0; // blank lines seen since the last line of the list
  let tight = true;
  let end = i;
  const add = (line) => {
    for (; blanks > 0; blanks--) cur.lines.push("");
    cur.lines.push(line);
    const f = cur.fence ? null : fenceOf(line);
    if (f) cur.fence = f;
    else if (cur.fence && closesFence(line, cur.fence)) cur.fence = null;
  };
  for (let j = i; j < lines.length; j++) {
    const line = lines[j];
    if (blank(line)) {
      blanks++;
      continue;
    }
    const ind = indentOf(line);
    const it = itemOf(line);
    if (cur && ind >= Math.min(cur.contentIndent, cur.indent + 2)) {
      // The item's own: a continuation or a nested block.
      const inner = line.slice(Math.min(ind, cur.contentIndent));
      if (blanks > 0 && !cur.fence && !itemOf(inner)) tight = false;
      add(inner);
    } else if (it && (!cur || same(it))) {
      if (cur && blanks > 0) tight = false;
      blanks = 0;
      cur = { indent: it.indent, contentIndent: it.contentIndent, lines: [it.content], fence: fenceOf(it.content) };
      items.push(cur);
    } else if (blanks === 0 && !cur.fence && !interrupts(line, 0) && !itemOf(line)) {
      add(line.trim()); // a lazy continuation of the item's paragraph
    } else break;
    end = j + 1;
  }
  return { type: "list", start: i, end, ordered: first.ordered, from: first.num, tight, items };
}

function drawBlock(b, depth) {
  switch (b.type) {
    case "p": {
      const p = h("p");
      inline(p, b.text, 0, false);
      return p;
    }
    case "h": {
      const e = h(`h${b.level}`);
      inline(e, b.text, 0, false);
      return e;
    }
    case "hr":
      return h("hr");
    case "code":
      return codeBlock(b.code, b.lang);
    case "quote": {
      const q = h("blockquote");
      for (const c of split(b.body, depth + 1)) q.append(drawBlock(c, depth + 1));
      return q;
    }
    case "list": {
      const l = h(b.ordered ? "ol" : "ul");
      if (b.ordered && b.from !== 1) l.start = b.from;
      for (const it of b.items) {
        const li = h("li");
        for (const c of split(it.lines, depth + 1)) {
          if (b.tight && c.type === "p") inline(li, c.text, 0, false);
          else li.append(drawBlock(c, depth + 1));
        }
        l.append(li);
      }
      return l;
    }
  }
  return h("p", "", "");
}

/// A fenced code block: its language, a Copy button, the code (scrolls sideways).
function codeBlock(code, lang) {
  const box = h("div", "md-code");
  const bar = h("div", "md-code-bar");
  bar.append(h("span", "md-lang", lang));
  const copy = h("button", "md-copy", "Copy");
  copy.type = "button";
  const pre = h("pre");
  const c = h("code", "", code);
  if (lang) c.dataset.lang = lang;
  pre.append(c);
  let timer = 0;
  const say = (text) => {
    copy.textContent = text;
    clearTimeout(timer);
    timer = setTimeout(() => (copy.textContent = "Copy"), 2000);
  };
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      say("Copied");
    } catch {
      // No clipboard here (not a secure context, or refused): the code selected, to copy by hand.
      getSelection()?.selectAllChildren(c);
      say("Selected");
    }
  });
  bar.append(copy);
  box.append(bar, pre);
  return box;
}

// ---- inline ----

const ESCAPABLE = /[!-/:-@[-`{-~]/;
const isSpace = (c) => c === undefined || /\s/.test(c);
const isPunct = (c) => c !== undefined && /[\p{P}\p{S}]/u.test(c);
const isAlnum = (c) => c !== undefined && /[\p{L}\p{N}]/u.test(c);

function runOf(s, i) {
  let j = i;
  while (s[j] === s[i]) j++;
  return j - i;
}

/// Whether the run of `n` delimiters at `i` can open (CommonMark's left-flanking; `_` not inside a word).
function canOpen(s, i, n) {
  const a = s[i - 1], b = s[i + n];
  const left = !isSpace(b) && (!isPunct(b) || isSpace(a) || isPunct(a));
  return left && (s[i] !== "_" || !isAlnum(a));
}

function canClose(s, i, n) {
  const a = s[i - 1], b = s[i + n];
  const right = !isSpace(a) && (!isPunct(a) || isSpace(b) || isPunct(b));
  return right && (s[i] !== "_" || !isAlnum(b));
}

/// Inline state of one run of text: which searches already failed (a search
/// that found nothing from one place finds nothing from a later one either),
/// so that text full of unmatched `*`, `_` or backticks stays linear.
class Scan {
  constructor(s) {
    this.s = s;
    this.noTicks = new Set();
    this.noCloser = new Set();
  }

  /// The next run of exactly `n` backticks from `from`, or -1.
  ticks(from, n) {
    if (this.noTicks.has(n)) return -1;
    const s = this.s;
    for (let j = s.indexOf("`", from); j >= 0; ) {
      const m = runOf(s, j);
      if (m === n) return j;
      j = s.indexOf("`", j + m);
    }
    this.noTicks.add(n);
    return -1;
  }

  /// Where the emphasis opened by `n` of `ch` at `from` closes: the index of its closing delimiters, or -1.
  closer(from, n, ch) {
    const key = ch + n;
    if (this.noCloser.has(key)) return -1;
    const s = this.s;
    let j = from;
    while (j < s.length) {
      const c = s[j];
      if (c === "\\") j += 2;
      else if (c === "`") {
        const m = runOf(s, j);
        const t = this.ticks(j + m, m);
        j = t < 0 ? j + m : t + m;
      } else if (c === ch) {
        const m = runOf(s, j);
        if (j > from && canClose(s, j, m)) {
          if (m === n) return j;
          if (m === 3) return j + 3 - n; // `***`: its last n close, the rest closes an inner one
        }
        j += m;
      } else j++;
    }
    this.noCloser.add(key);
    return -1;
  }

  /// A link at `i` (`[text](destination "title")`): {text, url, end}, or null.
  link(i) {
    const s = this.s;
    let depth = 0;
    let j = i;
    const stop = Math.min(s.length, i + LINK_SPAN);
    for (; j < stop; j++) {
      const c = s[j];
      if (c === "\\") j++;
      else if (c === "`") {
        const m = runOf(s, j);
        const t = this.ticks(j + m, m);
        j = (t < 0 ? j + m : t + m) - 1;
      } else if (c === "[") depth++;
      else if (c === "]" && --depth === 0) break;
    }
    if (j >= stop || s[j + 1] !== "(") return null;
    const text = s.slice(i + 1, j);
    let k = j + 2;
    while (s[k] === " " || s[k] === "\n") k++;
    let url = "";
    if (s[k] === "<") {
      const close = s.indexOf(">", k);
      if (close < 0 || close - k > LINK_SPAN || /[\n<]/.test(s.slice(k + 1, close))) return null;
      url = s.slice(k + 1, close);
      k = close + 1;
    } else {
      let parens = 0;
      const start = k;
      for (; k < s.length && k - start < LINK_SPAN; k++) {
        const c = s[k];
        if (c === "\\" && ESCAPABLE.test(s[k + 1] || "")) k++;
        else if (c === "(") parens++;
        else if (c === ")") {
          if (parens === 0) break;
          parens--;
        } else if (/\s/.test(c)) break;
      }
      url = s.slice(start, k).replace(/\\([!-/:-@[-`{-~])/g, "$1");
    }
    while (s[k] === " " || s[k] === "\n") k++;
    const q = s[k];
    if (q === '"' || q === "'") {
      const close = s.indexOf(q, k + 1);
      if (close < 0 || close - k > LINK_SPAN) return null;
      k = close + 1;
      while (s[k] === " " || s[k] === "\n") k++;
    }
    if (s[k] !== ")") return null;
    return { text, url, end: k + 1 };
  }
}

/// The URL a link may open: http(s) and mailto only, as the browser reads it; else null.
export function safeUrl(raw) {
  const u = raw.trim();
  if (!/^(?:https?|mailto):/i.test(u)) return null;
  try {
    const url = new URL(u);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/// Appends the inline content of `s` to `parent`.
function inline(parent, s, depth, inLink, scan = new Scan(s), from = 0, to = s.length) {
  let buf = "";
  const flush = () => {
    if (buf) parent.append(buf);
    buf = "";
  };
  let i = from;
  while (i < to) {
    const c = s[i];
    if (c === "\\" && i + 1 < to && ESCAPABLE.test(s[i + 1])) {
      buf += s[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      const n = runOf(s, i);
      const close = scan.ticks(i + n, n);
      if (close < 0 || close + n > to) {
        buf += s.slice(i, i + n);
        i += n;
        continue;
      }
      let code = s.slice(i + n, close).replace(/\n/g, " ");
      if (code.length > 2 && code.startsWith(" ") && code.endsWith(" ") && code.trim()) code = code.slice(1, -1);
      flush();
      parent.append(h("code", "", code));
      i = close + n;
      continue;
    }
    if (c === "[" && !inLink && depth < INLINE_DEPTH) {
      const l = scan.link(i);
      if (l && l.end <= to) {
        flush();
        const href = safeUrl(l.url);
        if (href) {
          const a = h("a");
          a.href = href;
          a.rel = "noopener noreferrer";
          a.target = "_blank";
          inline(a, l.text, depth + 1, true);
          parent.append(a);
        } else buf += s.slice(i, l.end); // not a link we open: its source, as text
        i = l.end;
        continue;
      }
    }
    if (c === "*" || c === "_") {
      const n = runOf(s, i);
      if (n > 3) {
        buf += s.slice(i, i + n);
        i += n;
        continue;
      }
      const close = depth < INLINE_DEPTH && canOpen(s, i, n) ? scan.closer(i + n, n, c) : -1;
      if (close < 0 || close + n > to) {
        // Unmatched as it is: one delimiter as text, the rest tried again (`**a*` is `*` then *a*).
        buf += c;
        i++;
        continue;
      }
      flush();
      let e;
      if (n === 3) {
        e = h("em");
        const strong = h("strong");
        e.append(strong);
        inline(strong, s, depth + 1, inLink, scan, i + 3, close);
      } else {
        e = h(n === 2 ? "strong" : "em");
        inline(e, s, depth + 1, inLink, scan, i + n, close);
      }
      parent.append(e);
      i = close + n;
      continue;
    }
    buf += c;
    i++;
  }
  flush();
}

// ---- drawing ----

/// `text` as Markdown: a DocumentFragment of safe nodes.
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  const lines = String(text ?? "").split("\n").map(clean);
  for (const b of split(lines, 0)) frag.append(drawBlock(b, 0));
  return frag;
}

const drawn = new WeakMap(); // element → {text, blocks: [{offset, key, node}]}

/// Draws `text` as Markdown into `el` (its children replaced). When `text`
/// extends what was drawn there last, only its last two blocks are drawn again.
export function renderInto(el, text) {
  text = String(text ?? "");
  let d = drawn.get(el);
  if (!d || !text.startsWith(d.text) || el.childNodes.length !== d.blocks.length) {
    el.replaceChildren();
    d = { text: "", blocks: [] };
    drawn.set(el, d);
  }
  if (text === d.text && d.blocks.length) return;
  const keep = Math.max(0, d.blocks.length - 2);
  const from = keep < d.blocks.length ? d.blocks[keep].offset : 0;
  const raw = text.slice(from).split("\n");
  const starts = [];
  let o = from;
  for (const l of raw) {
    starts.push(o);
    o += l.length + 1;
  }
  const lines = raw.map(clean);
  const next = split(lines, 0).map((b) => ({ offset: starts[b.start], key: `${b.type}\n${lines.slice(b.start, b.end).join("\n")}`, b }));
  next.forEach((n, k) => {
    const old = d.blocks[keep + k];
    if (old && old.key === n.key) {
      n.node = old.node;
      return;
    }
    n.node = drawBlock(n.b, 0);
    if (old) old.node.replaceWith(n.node);
    else el.append(n.node);
  });
  for (const old of d.blocks.slice(keep + next.length)) old.node.remove();
  d.blocks = d.blocks.slice(0, keep).concat(next.map(({ offset, key, node }) => ({ offset, key, node })));
  d.text = text;
}
