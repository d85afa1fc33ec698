"""The review page ``flywheel ui`` serves at ``/`` (issue 25): rendered on the server from
the queue's items, with one small inline script and no file from anywhere else (it works
offline).

Every logged text is user input: it reaches the page only through :func:`html.escape`
(in the markup) or JSON with ``<`` written as ``\\u003c`` (the script's data), so a
logged ``<script>`` shows as text and never runs.

Each row offers its likely intents as buttons (``1``-``9``, as ``flywheel review``),
``0`` (or ``o``, as ``flywheel review``) out of scope, and a box that takes any intent of
the served set (type to filter, Enter to label; ``/`` jumps to it), so the right label is
there when neither model had it. A row that merges several decisions with the same text says how many (``×N``); its
label is sent for every one of them. Long texts are clipped to a few lines with a
``more`` control (``f`` on the keyboard, as in ``flywheel review``). ``s`` or ``j`` next item, ``k`` previous.
Labels are sent to ``POST /api/labels`` with the admin token typed into the page (kept for
the tab only). A language select (the logged languages) reloads the page with
``?language=``; each row shows its query's language under the layer. In a window
:data:`NARROW_PX` wide or narrower each row is a card (its cells stacked, each named, the
label buttons under the text), so no row needs a sideways scroll.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

__all__ = ["CLIP_CHARS", "CLIP_LINES", "ICON_LINK", "ICON_SVG", "NARROW_PX", "OUT_OF_SCOPE_KEYS", "render_page"]

#: a text longer than this (or with more lines than :data:`CLIP_LINES`) is clipped, with a "more" control
CLIP_CHARS = 300
#: the lines a clipped text shows
CLIP_LINES = 3
#: the pages' icon (a ring: the flywheel), served at ``/favicon.ico`` too
ICON_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><circle cx="8" cy="8" r="5.5" '
            'fill="none" stroke="#3366cc" stroke-width="3"/><circle cx="8" cy="8" r="1.5" fill="#3366cc"/></svg>')
#: the ``<link>`` that declares it inline in a page's head (nothing fetched)
ICON_LINK = f'<link rel="icon" type="image/svg+xml" href="data:image/svg+xml,{quote(ICON_SVG)}">'
#: the keys that label a row out of scope; its button's badge shows the first (a digit, as the
#: other buttons' badges: a small grey ``o`` beside them reads as ``0``), the help names both
OUT_OF_SCOPE_KEYS = ("0", "o")
#: at this window width (CSS px) or narrower each row is a card: its cells stacked, the label buttons under the text
NARROW_PX = 900

_STYLE = ("""
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} table{border-collapse:collapse;width:100%;min-width:80em;table-layout:fixed}
td,th{border-bottom:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top}
th.n{width:2.5em} th.served{width:13em} th.teacher{width:11em} th.reason{width:9em} th.label{width:24em}
th.done{width:8em}
tr.current{background:#fff5cc} tr.done{opacity:.45}
.text{font-family:ui-monospace,monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.clip{display:-webkit-box;-webkit-box-orient:vertical;-webkit-line-clamp:@LINES;line-clamp:@LINES;
      overflow:hidden;max-height:@HEIGHTem}
.more{font-size:.85em;padding:0 .4em;margin-top:.2em}
.count{display:inline-block;background:#e4ecf7;border-radius:.6em;padding:0 .45em;margin-left:.3em;
       font-size:.85em;font-family:system-ui,sans-serif}
.choice{margin:0 .3em .3em 0;padding:.1em .45em} .choice kbd{color:#666;margin-right:.25em}
.other input{width:13em} .why{color:#666} td{overflow-wrap:anywhere} #status{margin:.5em 0;min-height:1.2em}
@media (max-width:@NARROWpx){
  body{margin:1em} table{min-width:0} thead{display:none}
  table,tbody,tr.item,tr.item>td{display:block}
  tr.item{border:1px solid #ddd;border-radius:.4em;margin:0 0 .8em;padding:.3em 0}
  tr.item>td{border:0;padding:.15em .6em} tr.item>td:empty{display:none}
  tr.item>td[data-th]::before{content:attr(data-th) ": ";color:#666;font-size:.85em}
  td.n{float:right;color:#666}
}
""".replace("@LINES", str(CLIP_LINES)).replace("@HEIGHT", f"{CLIP_LINES * 1.4:.1f}")
          .replace("@NARROW", str(NARROW_PX)))

_SCRIPT = """
(function(){
  const OUT_OF_SCOPE_KEYS = @OOS_KEYS;
  const data = JSON.parse(document.getElementById('items').textContent);
  const items = data.items, intents = data.intents;
  const rows = Array.from(document.querySelectorAll('tr.item'));
  const status = document.getElementById('status');
  const tokenBox = document.getElementById('token');
  tokenBox.value = sessionStorage.getItem('flywheel-token') || '';
  tokenBox.addEventListener('change', () => sessionStorage.setItem('flywheel-token', tokenBox.value));
  let at = 0;
  function focus(i, scroll){
    if (!rows.length) return;
    at = Math.max(0, Math.min(rows.length - 1, i));
    rows.forEach((r, j) => r.classList.toggle('current', j === at));
    if (scroll) rows[at].scrollIntoView({block: 'nearest'});
  }
  // what was typed as an intent: one of the served set (any case, or the one it starts), else null
  function resolve(typed){
    const t = typed.trim(), up = t.toUpperCase();
    if (!t) return null;
    if (['OUT_OF_SCOPE', 'OOS', 'NONE'].includes(up)) return 'OUT_OF_SCOPE';
    if (intents === null) return t;
    const exact = intents.find(n => n.toUpperCase() === up);
    if (exact) return exact;
    const starts = intents.filter(n => n.toUpperCase().startsWith(up));
    return starts.length === 1 ? starts[0] : null;
  }
  async function label(i, value){
    const item = items[i];
    if (!item || rows[i].classList.contains('done')) return;
    const ids = item.decision_ids && item.decision_ids.length ? item.decision_ids : [item.decision_id];
    let sent = 0;
    for (let k = 0; k < ids.length; k += 1000) {     // the API takes up to 1000 labels a request
      const res = await fetch('/api/labels', {method: 'POST',
        headers: {'content-type': 'application/json', 'authorization': 'Bearer ' + tokenBox.value},
        body: JSON.stringify({labels: ids.slice(k, k + 1000).map(id => ({decision_id: id, label: value}))})});
      const doc = await res.json().catch(() => ({error: res.statusText}));
      if (!res.ok) {
        status.textContent = 'not recorded: ' + (doc.error || res.status)
          + (sent ? ' (' + sent + ' of ' + ids.length + ' recorded before)' : '');
        return;
      }
      sent += doc.n;
    }
    rows[i].classList.add('done');
    rows[i].querySelector('.outcome').textContent = value + (ids.length > 1 ? ' \\u00d7' + ids.length : '');
    status.textContent = 'recorded ' + value + (ids.length > 1 ? ' for ' + ids.length + ' decisions' : '');
    if (i === at) focus(at + 1, true);
  }
  rows.forEach((row, i) => {
    row.addEventListener('click', (e) => { if (e.target.tagName !== 'INPUT') focus(i, false); });
    row.querySelectorAll('button.choice').forEach(b => b.addEventListener('click', () => label(i, b.dataset.label)));
    const more = row.querySelector('button.more');
    if (more) more.addEventListener('click', () => toggle(i));
    const form = row.querySelector('form.other'), box = form.querySelector('input');
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const value = resolve(box.value);
      if (value === null) {
        status.textContent = 'not an intent: ' + JSON.stringify(box.value.trim()) + ' (pick one from the list)';
        return;
      }
      box.blur();
      label(i, value);
    });
    box.addEventListener('keydown', (e) => { if (e.key === 'Escape') box.blur(); });
  });
  function toggle(i){
    const text = rows[i].querySelector('.text'), more = rows[i].querySelector('button.more');
    if (!more) return;
    const open = text.classList.toggle('clip') === false;
    more.textContent = open ? 'less' : 'more';
    more.setAttribute('aria-expanded', String(open));
  }
  document.addEventListener('keydown', (e) => {
    if (e.target.tagName === 'INPUT' || e.ctrlKey || e.metaKey || e.altKey) return;
    const item = items[at];
    if (!item) return;
    if (e.key >= '1' && e.key <= '9') {
      const c = item.choices[Number(e.key) - 1];
      if (c !== undefined) label(at, c);
    } else if (OUT_OF_SCOPE_KEYS.includes(e.key)) { label(at, 'OUT_OF_SCOPE'); }
    else if (e.key === '/') { e.preventDefault(); rows[at].querySelector('form.other input').focus(); }
    else if (e.key === 'f') { toggle(at); }
    else if (e.key === 's' || e.key === 'j') { focus(at + 1, true); }
    else if (e.key === 'k') { focus(at - 1, true); }
  });
  focus(0, false);     // no scroll on load: the page opens at its title and token box
})();
""".replace("@OOS_KEYS", json.dumps(list(OUT_OF_SCOPE_KEYS)))


def _json_for_script(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _teacher(item: dict[str, Any]) -> str:
    if item.get("candidates"):
        return "unsure: " + ", ".join(item["candidates"])
    if item.get("teacher_label"):
        return str(item["teacher_label"])
    return "OUT_OF_SCOPE" if item.get("teacher_answered") else ""


def _text(item: dict[str, Any]) -> str:
    e = html.escape
    text = str(item["text"])
    long = len(text) > CLIP_CHARS or text.count("\n") >= CLIP_LINES
    n = int(item.get("count") or len(item.get("decision_ids") or ()) or 1)
    count = "" if n < 2 else (f' <span class="count" title="{n} decisions with this text: one label answers '
                              f'all of them">\u00d7{n}</span>')
    more = ' <button type="button" class="more" aria-expanded="false">more</button>' if long else ""
    return f'<td><div class="text{" clip" if long else ""}">{e(text)}</div>{count}{more}</td>'


def _row(i: int, item: dict[str, Any]) -> str:
    e = html.escape
    choices = "".join(f'<button type="button" class="choice" data-label="{e(c)}"><kbd>{n}</kbd>{e(c)}</button>'
                      for n, c in enumerate(item["choices"][:9], 1))
    oos = (f'<button type="button" class="choice" data-label="OUT_OF_SCOPE"><kbd>{OUT_OF_SCOPE_KEYS[0]}</kbd>'
           'OUT_OF_SCOPE</button>')
    other = ('<form class="other"><input list="intents" placeholder="any intent (/)" aria-label="any intent"'
             ' autocomplete="off"> <button type="submit">label</button></form>')
    conf = "" if item.get("confidence") is None else f" ({item['confidence']:.2f})"
    lang = f" \u00b7 {item['language']}" if item.get("language") else ""
    # layer 2's own answer where it differs from the served one: what teacher_vs_l2 compares (a
    # name too long for the column wraps after "layer 2:", one wider still inside, as any cell may)
    said = item.get("l2_label") if item.get("l2_answered") else None
    l2 = "" if said is None or said == str(item["label"]) else \
        f'<br><span class="why">layer 2: {e(said)}</span>'
    # data-th: the column's name, shown before the cell when the rows are stacked (narrow windows)
    return (f'<tr class="item" data-id="{e(item["decision_id"])}"><td class="n">{i + 1}</td>{_text(item)}'
            f'<td data-th="served">{e(str(item["label"]))}{e(conf)}<br><span class="why">'
            f'{e(item["layer"] + lang)}</span>{l2}</td>'
            f'<td data-th="teacher">{e(_teacher(item))}</td>'
            f'<td class="why" data-th="why">{e(", ".join(item["reasons"]))}</td>'
            f'<td class="label">{choices}{oos}{other}</td><td class="outcome" data-th="labelled"></td></tr>')


def _intents(items: Sequence[dict[str, Any]], labels: Sequence[str] | None) -> list[str]:
    """What the "any intent" box offers: the served set (else every choice on the page), then out of scope."""
    names = list(labels) if labels is not None else [c for it in items for c in it["choices"]]
    return [n for n in dict.fromkeys(names) if n != "OUT_OF_SCOPE"] + ["OUT_OF_SCOPE"]


def _language_form(languages: Sequence[str], language: str | None) -> str:
    """A GET form with the language select (``any`` and ``languages``), ``language`` selected;
    none when no language is logged and none is asked for (nothing to choose)."""
    e = html.escape
    if not languages and not language:
        return ""
    opts = "".join(f'<option value="{e(v)}"{" selected" if v == (language or "") else ""}>{e(v or "any")}</option>'
                   for v in ["", *dict.fromkeys([*languages, *([language] if language else [])])])
    return (f'<form method="get" action="/" id="filters"><label>Language <select name="language" '
            f'onchange="this.form.submit()">{opts}</select></label> <noscript><button>show</button></noscript></form>')


def render_page(items: Sequence[dict[str, Any]], *, writable: bool, labels: Sequence[str] | None = None,
                languages: Sequence[str] = (), language: str | None = None) -> str:
    """The review page for ``items`` (:meth:`training.review.queue.ReviewItem.to_dict` documents);
    ``labels``: the served intent set (every one of them can be given to any row); ``languages``
    the select's choices, ``language`` the one the queue is filtered by (``None``: any)."""
    rows = "\n".join(_row(i, it) for i, it in enumerate(items)) or \
        '<tr><td colspan="7">The review queue is empty.</td></tr>'
    note = ("Type the admin token, then label the highlighted row: 1-9 pick a likely intent, "
            f"{' or '.join(OUT_OF_SCOPE_KEYS)} out of scope, "
            "/ type any other intent (Enter labels), f show a long text whole, s or j next, k previous. "
            "A row marked \u00d7N stands for N decisions with the same text; its label answers all of them."
            ) if writable else "Read-only: start flywheel ui with --admin-token to label here."
    known = "" if not labels else f"<p class=\"why\">Intents: {html.escape(', '.join(labels))}</p>"
    options = "".join(f'<option value="{html.escape(n)}"></option>' for n in _intents(items, labels))
    data = {"items": list(items), "intents": None if labels is None else _intents(items, labels)}
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flywheel review</title>
<meta name="viewport" content="width=device-width, initial-scale=1">{ICON_LINK}
<style>{_STYLE}</style></head>
<body>
<h1>flywheel review queue</h1>
<p><a href="/dashboard">dashboard</a></p>
<p>{html.escape(note)}</p>
<p><label>Admin token <input id="token" type="password" autocomplete="off"{'' if writable else ' disabled'}>
</label></p>
{known}
{_language_form(languages, language)}
<div id="status" role="status"></div>
<datalist id="intents">{options}</datalist>
<table><thead><tr><th class="n">#</th><th>text</th><th class="served">served</th><th class="teacher">teacher</th>
<th class="reason">why</th><th class="label">label</th><th class="done">labelled</th></tr></thead>
<tbody>
{rows}
</tbody></table>
<script type="application/json" id="items">{_json_for_script(data)}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
