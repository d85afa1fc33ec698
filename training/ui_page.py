"""The review page ``flywheel ui`` serves at ``/`` (issue 25): rendered on the server from
the queue's items, with one small inline script and no file from anywhere else (it works
offline).

Every logged text is user input: it reaches the page only through :func:`html.escape`
(in the markup) or JSON with ``<`` written as ``\\u003c`` (the script's data), so a
logged ``<script>`` shows as text and never runs.

Keys (as ``flywheel review``): ``1``-``9`` label the highlighted item with that intent,
``o`` out of scope, ``s`` or ``j`` next item, ``k`` previous. A label is sent to
``POST /api/labels`` with the admin token typed into the page (kept for the tab only).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["render_page"]

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top}
tr.current{background:#fff5cc} tr.done{opacity:.45} .text{font-family:ui-monospace,monospace}
.choice{margin-right:.6em} .why{color:#666} #status{margin:.5em 0;min-height:1.2em}
"""

_SCRIPT = """
(function(){
  const items = JSON.parse(document.getElementById('items').textContent);
  const rows = Array.from(document.querySelectorAll('tr.item'));
  const status = document.getElementById('status');
  const tokenBox = document.getElementById('token');
  tokenBox.value = sessionStorage.getItem('flywheel-token') || '';
  tokenBox.addEventListener('change', () => sessionStorage.setItem('flywheel-token', tokenBox.value));
  let at = 0;
  function focus(i){
    if (!rows.length) return;
    at = Math.max(0, Math.min(rows.length - 1, i));
    rows.forEach((r, j) => r.classList.toggle('current', j === at));
    rows[at].scrollIntoView({block: 'nearest'});
  }
  async function label(value){
    const item = items[at];
    if (!item || rows[at].classList.contains('done')) return;
    const res = await fetch('/api/labels', {method: 'POST',
      headers: {'content-type': 'application/json', 'authorization': 'Bearer ' + tokenBox.value},
      body: JSON.stringify({decision_id: item.decision_id, label: value})});
    const doc = await res.json().catch(() => ({error: res.statusText}));
    if (!res.ok) { status.textContent = 'not recorded: ' + (doc.error || res.status); return; }
    rows[at].classList.add('done');
    rows[at].querySelector('.outcome').textContent = value;
    status.textContent = 'recorded ' + value;
    focus(at + 1);
  }
  document.addEventListener('keydown', (e) => {
    if (e.target === tokenBox || e.ctrlKey || e.metaKey || e.altKey) return;
    const item = items[at];
    if (!item) return;
    if (e.key >= '1' && e.key <= '9') {
      const c = item.choices[Number(e.key) - 1];
      if (c !== undefined) label(c);
    } else if (e.key === 'o') { label('OUT_OF_SCOPE'); }
    else if (e.key === 's' || e.key === 'j') { focus(at + 1); }
    else if (e.key === 'k') { focus(at - 1); }
  });
  focus(0);
})();
"""


def _json_for_script(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _row(i: int, item: dict[str, Any]) -> str:
    e = html.escape
    choices = " ".join(f'<span class="choice">{n}) {e(c)}</span>' for n, c in enumerate(item["choices"], 1))
    teacher = item.get("teacher_label") or ""
    if item.get("candidates"):
        teacher = "unsure: " + ", ".join(item["candidates"])
    conf = "" if item.get("confidence") is None else f" ({item['confidence']:.2f})"
    return (f'<tr class="item" data-id="{e(item["decision_id"])}"><td>{i + 1}</td>'
            f'<td class="text">{e(item["text"])}</td>'
            f'<td>{e(str(item["label"]))}{e(conf)}<br><span class="why">{e(item["layer"])}</span></td>'
            f'<td>{e(teacher)}</td><td class="why">{e(", ".join(item["reasons"]))}</td>'
            f'<td>{choices} <span class="choice">o) OUT_OF_SCOPE</span></td><td class="outcome"></td></tr>')


def render_page(items: Sequence[dict[str, Any]], *, writable: bool, labels: Sequence[str] | None = None) -> str:
    """The review page for ``items`` (:meth:`training.review.ReviewItem.to_dict` documents)."""
    rows = "\n".join(_row(i, it) for i, it in enumerate(items)) or \
        '<tr><td colspan="7">The review queue is empty.</td></tr>'
    note = ("Type the admin token, then label the highlighted row: 1-9 pick an intent, o out of scope, "
            "s or j next, k previous.") if writable else \
        "Read-only: start flywheel ui with --admin-token to label here."
    known = "" if not labels else f"<p class=\"why\">Intents: {html.escape(', '.join(labels))}</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flywheel review</title>
<style>{_STYLE}</style></head>
<body>
<h1>flywheel review queue</h1>
<p><a href="/dashboard">dashboard</a></p>
<p>{html.escape(note)}</p>
<p><label>Admin token <input id="token" type="password" autocomplete="off"{'' if writable else ' disabled'}>
</label></p>
{known}
<div id="status" role="status"></div>
<table><thead><tr><th>#</th><th>text</th><th>served</th><th>teacher</th><th>why</th><th>keys</th>
<th>labelled</th></tr></thead>
<tbody>
{rows}
</tbody></table>
<script type="application/json" id="items">{_json_for_script(list(items))}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
