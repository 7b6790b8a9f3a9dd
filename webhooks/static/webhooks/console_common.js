/* What the console's live pages (dashboard.js, rebind_page.js) share, as window.a2aConsole:
   `el` builds an element, `setText` fills one by id, `when` shows an ISO time in the console's
   one format (a <time> element: "23:44:46 UTC · 2 min ago", a2a_platform/lib/times.py: keep
   the two in step), and `poll` fetches `root`'s data-url
   as JSON every data-interval-ms (or `defaultMs`), hands each answer to `onData`, counts the
   polls in data-polls, and says a failed update in the element `statusId` until the next
   success. A lapsed session is redirected to the login page (admin_view): HTML, not JSON,
   said as such. A hidden tab does not poll; it catches up as soon as it is shown again.
   Loaded before the page's own script. No library, no build step. */
(function () {
  "use strict";

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "string" || typeof c === "number"
        ? document.createTextNode(String(c)) : c);
    });
    return node;
  }

  function setText(id, text) {
    var node = document.getElementById(id);
    if (node) { node.textContent = String(text); }
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function relative(at, now) {
    var seconds = Math.trunc((now - at) / 1000), span = Math.abs(seconds), amount;
    if (span < 60) { amount = span + " s"; }
    else if (span < 3600) { amount = Math.floor(span / 60) + " min"; }
    else if (span < 48 * 3600) { amount = Math.floor(span / 3600) + " h"; }
    else { amount = Math.floor(span / 86400) + " d"; }
    return seconds >= 0 ? amount + " ago" : "in " + amount;
  }

  function absolute(at, now) {
    var day = at.toISOString().slice(0, 10);
    return (day === now.toISOString().slice(0, 10) ? "" : day + " ") + pad(at.getUTCHours()) +
      ":" + pad(at.getUTCMinutes()) + ":" + pad(at.getUTCSeconds()) + " UTC";
  }

  function whenText(iso, now) {
    if (!iso) { return "–"; }
    var at = new Date(iso), today = now || new Date();
    return absolute(at, today) + " · " + relative(at, today);
  }

  function when(iso, now) {
    if (!iso) { return document.createTextNode("–"); }
    var at = new Date(iso), today = now || new Date();
    var full = at.toISOString().replace(/\.\d{3}Z$/, "Z");
    return el("time", { "class": "a2a-time", datetime: full, title: full }, [
      el("span", {}, [absolute(at, today)]), " · ", el("span", {}, [relative(at, today)])]);
  }

  function poll(root, statusId, defaultMs, onData) {
    var interval = Number(root.getAttribute("data-interval-ms")) || defaultMs;
    var polls = 0;
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
          setText(statusId, "");
        })
        .catch(function (err) { setText(statusId, "(update failed: " + err.message + "; retrying)"); })
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
  }

  window.a2aConsole = { el: el, setText: setText, when: when, whenText: whenText, poll: poll };
})();
