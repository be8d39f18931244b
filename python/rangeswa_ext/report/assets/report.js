// rangeswa report: the sample browser. Reads the JSON block #report-data (built by page.py), fills the
// selectors, and shows every method's text for one (run, length, index). The query string picks the first
// view (?model=...&seed=...&length=...&index=...); window.rangeswaReport.show({...}) switches it.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var grid = document.getElementById("sample-grid");
  if (!grid || !data.runs.length) {
    window.rangeswaReport = { show: function () { return null; }, state: function () { return null; } };
    return;
  }
  var runSelect = document.getElementById("run-select");
  var lengthSelect = document.getElementById("length-select");
  var indexSelect = document.getElementById("index-select");
  var state = { run: 0, length: null, index: null };

  function option(select, value, text) {
    var item = document.createElement("option");
    item.value = String(value);
    item.textContent = text;
    select.appendChild(item);
  }

  function fill(select, values, label) {
    select.textContent = "";
    values.forEach(function (value) { option(select, value, label(value)); });
  }

  data.runs.forEach(function (run, i) { option(runSelect, i, run.model + " · seed " + run.seed); });
  if (data.runs.length < 2) { document.getElementById("run-label").style.display = "none"; }

  function closest(values, wanted) {
    if (values.indexOf(wanted) >= 0) { return wanted; }
    return values[values.length - 1];
  }

  function render() {
    var run = data.runs[state.run];
    var samples = run.samples[state.length + "/" + state.index] || [];
    runSelect.value = String(state.run);
    lengthSelect.value = String(state.length);
    indexSelect.value = String(state.index);
    grid.textContent = "";
    samples.forEach(function (sample) {
      var card = document.createElement("article");
      card.className = "sample";
      card.setAttribute("data-method", sample.method);
      var title = document.createElement("h4");
      title.textContent = sample.label;
      card.appendChild(title);
      var stats = document.createElement("div");
      stats.className = "stats";
      sample.stats.forEach(function (pair) {
        var item = document.createElement("span");
        if (pair[0] === "H" && sample.low) { item.className = "low"; item.title = "H < 5: low diversity"; }
        item.appendChild(document.createTextNode(pair[0] + " "));
        var value = document.createElement("b");
        value.textContent = pair[1];
        item.appendChild(value);
        stats.appendChild(item);
      });
      card.appendChild(stats);
      if (sample.verdicts.length) {
        var verdicts = document.createElement("div");
        verdicts.className = "verdicts";
        verdicts.textContent = "judge: " + sample.verdicts.join(", ");
        card.appendChild(verdicts);
      }
      var text = document.createElement("div");
      text.className = "text";
      text.innerHTML = sample.html;  // escaped by page.py; only <mark> elements inside
      card.appendChild(text);
      grid.appendChild(card);
    });
    if (!samples.length) {
      grid.innerHTML = '<p class="empty">No sample at this length and index.</p>';
    }
    grid.setAttribute("data-length", String(state.length));
    grid.setAttribute("data-index", String(state.index));
  }

  function show(wanted) {
    wanted = wanted || {};
    var run = state.run;
    if (wanted.model !== undefined || wanted.seed !== undefined) {
      data.runs.forEach(function (r, i) {
        if ((wanted.model === undefined || r.model === wanted.model) &&
            (wanted.seed === undefined || String(r.seed) === String(wanted.seed))) { run = i; }
      });
    }
    if (wanted.run !== undefined) { run = Number(wanted.run); }
    var lengths = data.runs[run].lengths;
    if (run !== state.run || !lengthSelect.options.length) {
      fill(lengthSelect, lengths, function (n) { return String(n); });
    }
    var length = closest(lengths, wanted.length !== undefined ? Number(wanted.length) :
      (state.length === null ? lengths[lengths.length - 1] : state.length));
    var indices = data.runs[run].indices[String(length)];
    if (run !== state.run || length !== state.length || !indexSelect.options.length) {
      fill(indexSelect, indices, function (k) { return String(k); });
    }
    var index = wanted.index !== undefined ? Number(wanted.index) : (state.index === null ? indices[0] : state.index);
    if (indices.indexOf(index) < 0) { index = indices[0]; }
    state = { run: run, length: length, index: index };
    render();
    return current();
  }

  function current() {
    var run = data.runs[state.run];
    return { model: run.model, seed: run.seed, length: state.length, index: state.index,
             methods: Array.prototype.map.call(grid.querySelectorAll(".sample"), function (card) {
               return card.getAttribute("data-method");
             }) };
  }

  function step(by) {
    var indices = data.runs[state.run].indices[String(state.length)];
    var at = indices.indexOf(state.index) + by;
    if (at >= 0 && at < indices.length) { show({ index: indices[at] }); }
  }

  runSelect.addEventListener("change", function () { state.length = null; state.index = null; show({ run: runSelect.value }); });
  lengthSelect.addEventListener("change", function () { show({ length: lengthSelect.value }); });
  indexSelect.addEventListener("change", function () { show({ index: indexSelect.value }); });
  document.getElementById("prev-sample").addEventListener("click", function () { step(-1); });
  document.getElementById("next-sample").addEventListener("click", function () { step(1); });

  var query = new URLSearchParams(window.location.search);
  var first = {};
  ["model", "seed", "length", "index"].forEach(function (key) {
    if (query.has(key)) { first[key] = query.get(key); }
  });
  window.rangeswaReport = { show: show, state: current };
  show(first);
})();
