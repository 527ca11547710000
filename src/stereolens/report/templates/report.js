/* Sortable tables: click a column header to sort its rows (numbers by value, empty cells
   last); click again to reverse. Cells carry their raw value in data-v. */
(function () {
  "use strict";
  function key(cell) {
    var raw = cell.getAttribute("data-v");
    if (raw !== null) { return { num: parseFloat(raw) }; }
    var text = cell.textContent.trim();
    if (text === "") { return { empty: true }; }
    var num = parseFloat(text.replace(/,/g, ""));
    if (!isNaN(num) && /^[-+]?[0-9.]/.test(text)) { return { num: num }; }
    return { text: text.toLowerCase() };
  }
  function compare(a, b) {
    if (a.empty || b.empty) { return (a.empty ? 1 : 0) - (b.empty ? 1 : 0); }
    if (a.num !== undefined && b.num !== undefined) { return a.num - b.num; }
    if (a.num !== undefined) { return -1; }
    if (b.num !== undefined) { return 1; }
    return a.text < b.text ? -1 : (a.text > b.text ? 1 : 0);
  }
  function sortBy(table, index, header) {
    var body = table.tBodies[0];
    if (!body) { return; }
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    var rows = Array.prototype.slice.call(body.rows).map(function (row, i) {
      return { row: row, key: key(row.cells[index]), i: i };
    });
    rows.sort(function (x, y) {
      var c = compare(x.key, y.key);
      if (x.key.empty || y.key.empty) { return c || x.i - y.i; }
      return (ascending ? c : -c) || x.i - y.i;
    });
    Array.prototype.forEach.call(header.parentNode.cells, function (th) {
      th.removeAttribute("aria-sort");
    });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    rows.forEach(function (r) { body.appendChild(r.row); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    if (!table.tHead) { return; }
    var headers = table.tHead.rows[table.tHead.rows.length - 1].cells;
    Array.prototype.forEach.call(headers, function (th, i) {
      th.tabIndex = 0;
      th.title = "sort by " + th.textContent.trim();
      th.addEventListener("click", function () { sortBy(table, i, th); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter") { sortBy(table, i, th); }
      });
    });
  });
})();
