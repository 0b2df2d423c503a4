// Palisade UI: small progressive enhancements on top of htmx. The pages
// work without this file; no inline scripts (the CSP forbids them).
(function () {
  "use strict";
  // Pause live polling while a force-release form is open, so the form is
  // not replaced under the operator's cursor.
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var open = document.querySelector("details.danger-zone[open]");
    if (open && evt.detail.elt && evt.detail.elt.contains(open)) {
      evt.preventDefault();
    }
  });
  // Close the force-release popover with Escape.
  document.addEventListener("keydown", function (evt) {
    if (evt.key !== "Escape") return;
    document.querySelectorAll("details.danger-zone[open]").forEach(function (d) {
      d.removeAttribute("open");
    });
  });
})();
