// Test-only layout probe for the HTML report (never part of the product):
// appended to a copy of index.html, run by headless Chromium, it measures
// the laid-out page and writes what it found as JSON into a `pre` element
// with the id `probe`, which `chromium --dump-dom` prints.
(function () {
  const out = { width: window.innerWidth, broken: [], squeezed: [], overflowing: [], page_overflow: 0 };
  const lineHeight = (el) => {
    const lh = parseFloat(getComputedStyle(el).lineHeight);
    return Number.isFinite(lh) ? lh : 1.5 * parseFloat(getComputedStyle(el).fontSize);
  };
  // A bench name is broken when its text is laid out on more than one line.
  for (const el of document.querySelectorAll('#overview td.bench a, nav a, .regressions a')) {
    const rects = Array.from(el.getClientRects()).filter((r) => r.width > 0);
    const tops = new Set(rects.map((r) => Math.round(r.top)));
    if (tops.size > 1 || el.getBoundingClientRect().height > 1.6 * lineHeight(el)) {
      out.broken.push(el.textContent);
    }
  }
  const main = document.querySelector('main').getBoundingClientRect();
  for (const table of document.querySelectorAll('main table')) {
    // A table wider than the page must sit in a box that scrolls sideways.
    let scrolls = false;
    for (let p = table.parentElement; p && p.tagName !== 'MAIN'; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll') scrolls = true;
    }
    const r = table.getBoundingClientRect();
    if (!scrolls && r.right > main.right + 1) {
      out.overflowing.push(table.querySelector('th') ? table.querySelector('th').textContent : 'table');
    }
    // A cell squeezed below a few characters breaks its text into columns
    // of letters: a head or a value of more than 3 characters in a cell
    // narrower than 3 em, or laid out on more lines than twice its own
    // (`<br>`-separated) lines plus two.
    // The height of the text, not of the cell: a cell is as tall as its row.
    const range = document.createRange();
    for (const cell of table.querySelectorAll('th, td')) {
      const text = cell.textContent.trim();
      const box = cell.getBoundingClientRect();
      const em = parseFloat(getComputedStyle(cell).fontSize);
      const lines = cell.querySelectorAll('br').length + 1;
      range.selectNodeContents(cell);
      const height = range.getBoundingClientRect().height;
      if (text.length > 3 && (box.width < 3 * em || height > (2 * lines + 2) * lineHeight(cell))) {
        out.squeezed.push(text.slice(0, 60));
      }
    }
  }
  out.page_overflow = Math.max(0, document.documentElement.scrollWidth - window.innerWidth);
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
