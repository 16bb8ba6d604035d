// The console works without this script. It only refreshes the numbers
// of the overview every 2 seconds and asks before a retry or a discard.
(function () {
  "use strict";
  document.querySelectorAll("form[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (e) {
      if (!window.confirm(f.getAttribute("data-confirm"))) { e.preventDefault(); }
    });
  });
  var box = document.querySelector("[data-refresh]");
  if (!box) { return; }
  var url = box.getAttribute("data-refresh");
  function show(v, unit) {
    if (unit !== "s") { return String(v); }
    if (v < 1) { return Math.round(v * 1000) + "ms"; }
    if (v < 60) { return v.toFixed(1) + "s"; }
    var m = Math.floor(v / 60), s = Math.round(v % 60);
    return m < 60 ? m + "m" + s + "s" : Math.floor(m / 60) + "h" + (m % 60) + "m";
  }
  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (o) {
        if (!o) { return; }
        box.querySelectorAll("[data-k]").forEach(function (el) {
          var k = el.getAttribute("data-k");
          if (k in o) {
            var pre = o.estimated && o.estimated[k] ? "\u2248 " : "";
            if (k === "backlog" && o.backlog_exact === false) { pre = "\u2265 "; }
            if (k === "oldest_unpublished_age_seconds" && o.oldest_unpublished_age_estimated) { pre = "\u2248 "; }
            el.textContent = pre + show(o[k], el.getAttribute("data-unit"));
          }
        });
      })
      .catch(function () {});
  }
  window.setInterval(refresh, 2000);
})();
