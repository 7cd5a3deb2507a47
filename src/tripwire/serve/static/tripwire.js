// tripwire dashboard: live updates without reloading the page. Every element marked
// data-live="URL" is refreshed from URL (a server-rendered fragment) every few seconds.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  function refresh(el) {
    var url = el.getAttribute("data-live");
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "tripwire" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null) {
          // A disclosure the reader opened stays open across refreshes (matched by its id).
          var open = [];
          var shown = el.querySelectorAll("details[open][id]");
          for (var i = 0; i < shown.length; i++) { open.push(shown[i].id); shown[i].open = false; }
          if (html !== el.innerHTML) { el.innerHTML = html; }
          for (var j = 0; j < open.length; j++) {
            var d = document.getElementById(open[j]);
            if (d) { d.open = true; }
          }
        }
        var stamp = document.getElementById("live-stamp");
        if (stamp) { stamp.textContent = "updated " + new Date().toLocaleTimeString(); }
      })
      .catch(function () { /* the next round tries again */ });
  }
  function tick() {
    var els = document.querySelectorAll("[data-live]");
    for (var i = 0; i < els.length; i++) { refresh(els[i]); }
  }
  if (document.querySelector("[data-live]")) { setInterval(tick, PERIOD_MS); }
})();
