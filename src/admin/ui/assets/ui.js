// The operator's page: refreshes the overview's counts every 10 s. Everything works
// without it; it only re-reads this same page and swaps in the sections that change.
(function () {
  "use strict";
  var sections = ["counts", "processors", "sources", "rate"];
  if (!document.getElementById("counts")) return;
  function refresh() {
    fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html");
        sections.forEach(function (id) {
          var now = document.getElementById(id), next = fresh.getElementById(id);
          if (now && next) now.replaceWith(document.importNode(next, true));
        });
      })
      .catch(function () { /* unreachable for now: the next tick tries again */ });
  }
  setInterval(refresh, 10000);
})();
