/* The console pages' one poller (dashboard.js, rebind_page.js): fetch `root`'s data-url as
   JSON every data-interval-ms (or `defaultMs`), hand each answer to `onData`, count the polls
   in data-polls, and say a failed update in the element `statusId` until the next success.
   A lapsed session is redirected to the login page (admin_view): HTML, not JSON, said as
   such. A hidden tab does not poll; it catches up as soon as it is shown again. */
(function () {
  "use strict";

  window.a2aPoll = function (root, statusId, defaultMs, onData) {
    var interval = Number(root.getAttribute("data-interval-ms")) || defaultMs;
    var polls = 0;
    function say(text) {
      var node = document.getElementById(statusId);
      if (node) { node.textContent = text; }
    }
    function poll() {
      fetch(root.getAttribute("data-url"), { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (response.redirected) { throw new Error("signed out, reload the page"); }
          var type = response.headers.get("content-type") || "";
          if (!response.ok || type.indexOf("application/json") !== 0) {
            throw new Error("HTTP " + response.status);
          }
          return response.json();
        })
        .then(function (fresh) {
          polls += 1;
          onData(fresh);
          root.setAttribute("data-polls", String(polls));
          say("");
        })
        .catch(function (err) { say("(update failed: " + err.message + "; retrying)"); })
        .then(function () { window.setTimeout(pollWhenShown, interval); });
    }
    function pollWhenShown() {
      if (document.hidden) {
        document.addEventListener("visibilitychange", function shown() {
          document.removeEventListener("visibilitychange", shown);
          poll();
        });
      } else {
        poll();
      }
    }
    window.setTimeout(pollWhenShown, interval);
  };
})();
