// The attention view (jax_attention/viz/attention_view.py). Run once per view, with the view's
// root element; reads the view's data from its <script type="application/json"> and draws into
// it. No global state, nothing fetched; labels are set as text, never parsed as HTML.
(function (root) {
  "use strict";
  const data = JSON.parse(root.querySelector("script.ja-view-data").textContent);
  const body = root.querySelector(".ja-view-body");
  const state = { tab: 0, layer: 0, head: -1, step: 0 };
  const T = data.text;  // the view's own words, in its language

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function color(w) {
    const i = Math.round(Math.min(1, Math.max(0, w)) * (data.colors.length - 1));
    return data.colors[i];
  }
  function fmt(w) { return w === null ? "NaN" : w.toFixed(3); }
  function isMasked(tab, l, h, t, s) { return tab.masked !== null && tab.masked[l][h][t][s] === 1; }

  function button(text, selected, onclick) {
    const b = el("button", selected ? "ja-selected" : "", text);
    b.type = "button";
    b.addEventListener("click", onclick);
    return b;
  }

  function select(cls, options, value, onchange) {
    const sel = el("select", cls);
    options.forEach(function (text, i) {
      const o = el("option", "", text);
      o.value = String(i);
      sel.appendChild(o);
    });
    sel.value = String(value);
    sel.addEventListener("change", function () { onchange(Number(sel.value)); });
    return sel;
  }

  function cell(tab, l, h, t, s, info) {
    const w = tab.weights[l][h][t][s];
    const td = el("td", "ja-cell");
    td.dataset.t = t; td.dataset.s = s;
    td.dataset.value = w === null ? "NaN" : String(w);
    const masked = isMasked(tab, l, h, t, s);
    td.dataset.masked = masked ? "1" : "0";
    if (masked) td.classList.add("ja-masked");
    else if (w === null) td.classList.add("ja-nan");
    else td.style.background = color(w);
    const text = tab.queries[t] + " \u2192 " + tab.keys[s] + ": " + (masked ? T.masked : fmt(w));
    td.title = text;
    td.addEventListener("mouseenter", function () { info.textContent = text; });
    return td;
  }

  function matrix(tab, l, h, info) {
    const table = el("table", "ja-matrix");
    table.dataset.layer = l; table.dataset.head = h;
    table.appendChild(el("caption", "", tab.heads[h]));
    const head = el("tr");
    head.appendChild(el("th", "ja-axis", tab.ylabel + " \\ " + tab.xlabel));
    tab.keys.forEach(function (k) { head.appendChild(el("th", "ja-key", k)); });
    table.appendChild(head);
    tab.queries.forEach(function (q, t) {
      const row = el("tr", "ja-row");
      const label = el("th", "ja-query", q);
      label.addEventListener("mouseenter", function () {
        row.classList.add("ja-row-hl");
        info.textContent = T.query + q + ": " + tab.keys.map(function (k, s) {
          return k + " " + (isMasked(tab, l, h, t, s) ? T.masked : fmt(tab.weights[l][h][t][s]));
        }).join(", ");
      });
      label.addEventListener("mouseleave", function () { row.classList.remove("ja-row-hl"); });
      row.appendChild(label);
      tab.keys.forEach(function (k, s) { row.appendChild(cell(tab, l, h, t, s, info)); });
      table.appendChild(row);
    });
    return table;
  }

  function legend(tab) {
    const box = el("div", "ja-legend");
    const scale = el("div", "ja-scale");
    const bar = el("div", "ja-bar");
    bar.style.background = "linear-gradient(to right, " + data.colors.filter(function (c, i) {
      return i % 16 === 0 || i === data.colors.length - 1; }).join(", ") + ")";
    scale.appendChild(el("span", "", "0"));
    scale.appendChild(bar);
    scale.appendChild(el("span", "", T.weight_legend));
    box.appendChild(scale);
    const masked = el("span");
    masked.appendChild(el("span", "ja-swatch ja-masked"));
    masked.appendChild(document.createTextNode(T.masked_legend));
    box.appendChild(masked);
    if (tab.has_nan) {
      const nan = el("span");
      nan.appendChild(el("span", "ja-swatch ja-nan"));
      nan.appendChild(document.createTextNode("NaN"));
      box.appendChild(nan);
    }
    return box;
  }

  function matrices(tab) {
    const part = el("div", "ja-part");
    const controls = el("div", "ja-controls");
    const label = el("label", "", T.layer);
    label.appendChild(select("ja-layer", tab.layers, state.layer, function (v) { state.layer = v; draw(); }));
    if (tab.layers.length > 1) controls.appendChild(label);
    const heads = el("label", "", T.head);
    heads.appendChild(select("ja-head", [T.all_heads].concat(tab.heads), state.head + 1,
      function (v) { state.head = v - 1; draw(); }));
    if (tab.heads.length > 1) controls.appendChild(heads);
    part.appendChild(controls);
    const info = el("div", "ja-info", T.hover);
    part.appendChild(info);
    const grid = el("div", "ja-grid");
    const shown = state.head < 0 ? tab.heads.map(function (_, h) { return h; }) : [state.head];
    shown.forEach(function (h) { grid.appendChild(matrix(tab, state.layer, h, info)); });
    part.appendChild(grid);
    part.appendChild(legend(tab));
    return part;
  }

  function steps(view) {
    const part = el("div", "ja-part ja-step-view");
    const buttons = el("div", "ja-steps");
    view.outputs.forEach(function (token, k) {
      const b = button(token, k === state.step, function () { state.step = k; draw(); });
      b.classList.add("ja-step");
      b.dataset.step = k;
      buttons.appendChild(b);
    });
    part.appendChild(el("div", "", T.steps));
    part.appendChild(buttons);
    const k = state.step;
    part.appendChild(el("div", "ja-info ja-step-info", T.step.replace("{n}", String(k + 1)) + view.outputs[k] +
      T.weighted));
    const row = el("div", "ja-step-row");
    row.dataset.step = k;
    view.source.forEach(function (token, s) {
      const w = view.weights[k][s];
      const c = el("div", "ja-step-cell", token);
      c.dataset.s = s; c.dataset.value = w === null ? "NaN" : String(w);
      c.style.background = w === null ? "#1e88e5" : color(w);
      if (w !== null && w > 0.6) c.style.color = "#fff";
      c.appendChild(el("span", "ja-value", fmt(w)));
      row.appendChild(c);
    });
    part.appendChild(row);
    return part;
  }

  function draw() {
    body.textContent = "";
    if (data.title) body.appendChild(el("div", "ja-title", data.title));
    if (data.steps) body.appendChild(steps(data.steps));
    if (data.tabs.length > 1) {
      const tabs = el("div", "ja-tabs");
      data.tabs.forEach(function (tab, i) {
        const b = button(tab.name, i === state.tab, function () {
          state.tab = i; state.layer = 0; state.head = -1; draw(); });
        b.classList.add("ja-tab");
        tabs.appendChild(b);
      });
      body.appendChild(tabs);
    }
    const tab = data.tabs[state.tab];
    body.appendChild(matrices(tab));
    if (data.steps) {
      body.querySelectorAll("tr.ja-row")[state.step].classList.add("ja-row-hl");
    }
  }

  draw();
})(document.currentScript.parentElement);
