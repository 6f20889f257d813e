// Draw every chart from its JSON block, then mark the page ready (tests and the load benchmark
// wait for body[data-charts="ready"]; window.autoplaceChartsReadyMs is the time since navigation).
(function () {
  var config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  var jobs = [];
  document.querySelectorAll("script[data-chart]").forEach(function (block) {
    var target = document.getElementById(block.getAttribute("data-chart"));
    var figure = JSON.parse(block.textContent);
    jobs.push(Plotly.newPlot(target, figure.data, figure.layout, config));
  });
  Promise.all(jobs).then(function () {
    window.autoplaceChartsReadyMs = performance.now();
    document.body.setAttribute("data-charts", "ready");
  });
})();

// The module tree: click a module's arrow to fold it, type to filter (matches keep their
// ancestors), click a column to sort (a sorted table is flat and shows full paths; "Module"
// returns to the tree).
(function () {
  var table = document.getElementById("modules");
  if (!table) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var byKey = {};
  rows.forEach(function (row, i) { row.dataset.index = i; byKey[row.dataset.key] = row; });
  var collapsed = {};
  var search = document.getElementById("module-search");
  var count = document.getElementById("module-count");
  var sortKey = "tree", sortDir = 1;

  if (rows.length > 60) {
    rows.forEach(function (row) {
      if (row.dataset.kind === "module" && +row.dataset.depth >= 2) collapsed[row.dataset.key] = true;
    });
  }

  function ancestors(row) {
    var out = [];
    for (var p = row.dataset.parent; p; p = byKey[p] ? byKey[p].dataset.parent : "") out.push(p);
    return out;
  }

  function refresh() {
    var query = (search.value || "").trim().toLowerCase();
    var keep = {};
    if (query) {
      rows.forEach(function (row) {
        var text = (row.dataset.label + " " + row.dataset.path + " " + row.dataset.devices).toLowerCase();
        if (text.indexOf(query) >= 0) {
          keep[row.dataset.key] = true;
          ancestors(row).forEach(function (k) { keep[k] = true; });
        }
      });
    }
    var shown = 0;
    rows.forEach(function (row) {
      var visible;
      if (query) visible = !!keep[row.dataset.key];
      else if (sortKey !== "tree") visible = true;
      else visible = !ancestors(row).some(function (k) { return collapsed[k]; });
      row.hidden = !visible;
      if (visible) shown += 1;
      var toggle = row.querySelector(".toggle");
      if (toggle && row.dataset.children === "1") toggle.textContent = collapsed[row.dataset.key] ? "▸" : "▾";
    });
    count.textContent = shown + " of " + rows.length + " rows";
  }

  function sortBy(key) {
    sortDir = key === sortKey ? -sortDir : (key === "devices" || key === "tree" ? 1 : -1);
    sortKey = key;
    var numeric = key !== "devices";
    var ordered = rows.slice().sort(function (a, b) {
      if (key === "tree") return a.dataset.index - b.dataset.index;
      var x = a.dataset[key], y = b.dataset[key];
      var c = numeric ? (+x - +y) : x.localeCompare(y);
      return c * sortDir || a.dataset.index - b.dataset.index;
    });
    ordered.forEach(function (row) { body.appendChild(row); });
    table.classList.toggle("flat", key !== "tree");
    table.querySelectorAll("th[data-sort]").forEach(function (th) {
      th.classList.remove("asc", "desc");
      if (th.dataset.sort === key && key !== "tree") th.classList.add(sortDir > 0 ? "asc" : "desc");
    });
    refresh();
  }

  table.querySelectorAll("th[data-sort]").forEach(function (th) {
    th.addEventListener("click", function () { sortBy(th.dataset.sort); });
  });
  body.addEventListener("click", function (event) {
    var toggle = event.target.closest(".toggle");
    if (!toggle) return;
    var key = toggle.closest("tr").dataset.key;
    collapsed[key] = !collapsed[key];
    refresh();
  });
  document.getElementById("module-expand").addEventListener("click", function () {
    collapsed = {};
    refresh();
  });
  document.getElementById("module-collapse").addEventListener("click", function () {
    rows.forEach(function (row) { if (row.dataset.kind === "module" && +row.dataset.depth >= 1) collapsed[row.dataset.key] = true; });
    refresh();
  });
  search.addEventListener("input", refresh);
  refresh();
})();
