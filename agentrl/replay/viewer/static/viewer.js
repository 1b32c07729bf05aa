// agentrl view: the only script of the viewer (CSP script-src 'self'). It adds hover read-outs
// to charts and tokens and submits the heat-map choice on change; every page works without it.
// Values are read from data-* attributes and written with textContent only (never as HTML).
(function () {
  "use strict";
  function onReady(fn) {
    if (document.readyState !== "loading") fn(); else document.addEventListener("DOMContentLoaded", fn);
  }
  var TOKEN_FIELDS = [
    ["lossMask", "loss_mask"], ["lp", "behavior log-prob"], ["tlp", "trainer log-prob"], ["gap", "gap"],
    ["ent", "entropy"], ["adv", "advantage"], ["v", "policy version"]
  ];
  function describeToken(el) {
    var d = el.dataset, parts = ["token " + d.i + " (id " + d.id + ", turn " + d.turn + ")"];
    TOKEN_FIELDS.forEach(function (f) {
      var v = d[f[0]];
      parts.push(f[1] + " " + (v === "" || v === undefined ? "–" : v));
    });
    return parts.join(" · ");
  }
  onReady(function () {
    var info = document.getElementById("tok-info");
    var view = document.getElementById("token-view");
    if (info && view) {
      view.addEventListener("mouseover", function (ev) {
        var el = ev.target.closest ? ev.target.closest(".tok") : null;
        if (el && view.contains(el)) info.textContent = describeToken(el);
      });
    }
    document.querySelectorAll("figure.chart").forEach(function (fig) {
      var out = fig.querySelector(".chart-info");
      if (!out) return;
      fig.addEventListener("mouseover", function (ev) {
        var title = ev.target && ev.target.querySelector ? ev.target.querySelector("title") : null;
        if (title) out.textContent = title.textContent + " (click: its episodes)";
      });
    });
    var heat = document.getElementById("heat-select");
    if (heat && heat.form) {
      heat.addEventListener("change", function () { heat.form.submit(); });
    }
  });
})();
