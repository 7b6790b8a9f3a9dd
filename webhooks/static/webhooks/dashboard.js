/* The operators' dashboard: draws the per-minute charts from the data the page was rendered
   with, then polls the dashboard JSON (data-url) every data-interval-ms and re-renders each
   section's rows from it, the same cells as templates/admin/dashboard/dashboard.html.
   No library, no build step. */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";

  // Shared with the other live page (console_common.js, loaded first).
  var el = window.a2aConsole.el;
  var setText = window.a2aConsole.setText;
  var when = window.a2aConsole.when;

  function td(text, cls) { return el("td", cls ? { "class": cls } : {}, [text]); }
  function yesno(v, yes, no) { return v ? yes : no; }
  function age(seconds) { return seconds === null || seconds === undefined ? "–" : Math.round(seconds) + " s"; }

  function fill(id, rows, emptyText, columns) {
    var body = document.getElementById(id);
    if (!body) { return; }
    while (body.firstChild) { body.removeChild(body.firstChild); }
    if (!rows.length && emptyText) {
      body.appendChild(el("tr", {}, [el("td", { colspan: String(columns) }, [emptyText])]));
    }
    rows.forEach(function (row) { body.appendChild(row); });
  }

  function chart(svg, perMinute, start) {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
    var n = perMinute.delivered.length, bar = width / n, max = 1, i;
    for (i = 0; i < n; i++) { max = Math.max(max, perMinute.delivered[i] + perMinute.failed[i]); }
    var first = new Date(start);
    svg.appendChild(el2("rect", { x: 0, y: 0, width: width, height: height, "class": "bg" }));
    for (i = 0; i < n; i++) {
      var ok = perMinute.delivered[i], bad = perMinute.failed[i];
      var hOk = ok / max * height, hBad = bad / max * height;
      var g = el2("g", { "data-minute": i });
      var minute = new Date(first.getTime() + i * 60000);
      var title = document.createElementNS(SVG, "title");
      title.textContent = minute.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) +
        ": " + ok + " delivered, " + bad + " failed";
      g.appendChild(title);
      if (ok) { g.appendChild(el2("rect", { x: i * bar, y: height - hOk, width: Math.max(bar - 0.5, 1), height: hOk, "class": "delivered" })); }
      if (bad) { g.appendChild(el2("rect", { x: i * bar, y: height - hOk - hBad, width: Math.max(bar - 0.5, 1), height: hBad, "class": "failed" })); }
      svg.appendChild(g);
    }
  }

  function el2(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    return node;
  }

  function link(href, text) { return el("a", { href: href }, [text]); }

  function agentRow(a, data, root) {
    var deliveries = root.getAttribute("data-delivery-url") + "?task__agent__id__exact=" + a.id + "&";
    var caps = a.capabilities, cells = [
      el("td", { "class": "c-agent" }, [link(root.getAttribute("data-agent-url") + a.id + "/change/", a.slug)]),
      td(a.card, "c-card"),
      td(yesno(caps.pushNotifications.on, "on", "off") + ": " + caps.pushNotifications.reason,
        "c-push " + yesno(caps.pushNotifications.on, "ok", "failing")),
      td(yesno(caps.streaming.on, "on", "off") + ": " + caps.streaming.reason,
        "c-streaming " + yesno(caps.streaming.on, "ok", "failing"))
    ];
    var f = a.deliveries;
    if (f) {
      var svg = el2("svg", { "class": "dash-chart", width: 240, height: 40, role: "img",
        "aria-label": "attempts per minute: delivered and failed" });
      chart(svg, f.perMinute, data.chart.start);
      cells.push(
        el("td", { "class": "c-queue c-num" }, [link(deliveries + "state__in=pending,sending", f.queueDepth)]),
        td(age(f.oldestPendingAgeSeconds), "c-oldest"),
        el("td", { "class": "c-held c-num" }, [link(deliveries + "state__exact=held", f.held)]),
        el("td", { "class": "c-dead c-num" }, [link(deliveries + "state__exact=dead", f.dead)]),
        el("td", { "class": "c-hour" }, [
          el("span", { "class": "c-delivered" }, [f.lastHour.delivered]), " / ",
          el("span", { "class": "c-failed" }, [f.lastHour.failed])]),
        el("td", { "class": "c-chart" }, [svg]));
    }
    return el("tr", { "data-agent": a.slug }, cells);
  }

  function render(root, data) {
    var r = data.readiness;
    var generated = document.getElementById("dash-generated");
    generated.replaceChildren(when(data.generatedAt));
    var ready = document.getElementById("dash-ready");
    ready.textContent = yesno(r.ready, "ready", "not ready");
    ready.className = yesno(r.ready, "ok", "failing");
    setText("dash-instance", r.instance);
    fill("dash-checks", r.checks.map(function (c) {
      return el("tr", { "class": yesno(c.ok, "ok", "failing"), "data-check": c.name },
        [td(c.name.replace(/_/g, " ")), td(yesno(c.ok, "ok", "FAILING"), "c-state"), td(c.detail, "c-detail")]);
    }));
    fill("dash-web-instances", r.webInstances.map(function (w) {
      var why = Object.keys(w.failing).map(function (k) { return k + ": " + w.failing[k]; });
      return el("tr", { "class": yesno(w.live && w.ready, "ok", "failing"), "data-web": w.name }, [
        el("td", {}, w.thisInstance ? [w.name, " ", el("small", {}, ["(this one, now)"])] : [w.name]),
        td(age(w.beatAgeSeconds), "c-age"), td(yesno(w.live, "live", "stale"), "c-live"),
        td(w.draining ? "draining" : yesno(w.ready, "ready", "not ready"), "c-ready"),
        td(why.join("; "), "c-detail")]);
    }), "no web instance has written a heartbeat", 5);
    fill("dash-workers", r.workers.map(function (w) {
      return el("tr", { "class": yesno(w.live, "ok", "failing"), "data-worker": w.hostname }, [
        el("td", {}, [link(root.getAttribute("data-worker-url") + w.id + "/change/", w.hostname)]),
        td(w.queues.join(", ")), td(age(w.beatAgeSeconds), "c-age"),
        td(yesno(w.live, "live", "stale"), "c-live"), td(yesno(w.backlogReenqueued, "yes", "no"))]);
    }), "no worker has registered", 5);
    fill("dash-agent-rows", data.agents.map(function (a) { return agentRow(a, data, root); }));
    if (data.endpoints) {
      setText("dash-endpoints-total", data.endpoints.total);
      setText("dash-endpoints-failing", data.endpoints.failing);
      setText("dash-endpoints-paused", data.endpoints.paused);
      fill("dash-endpoint-rows", data.endpoints.rows.map(function (e) {
        var paused = e.pausedAt ? ["since ", when(e.pausedAt), e.pausedReason ? ": " + e.pausedReason : ""] : ["no"];
        var hour = e.lastHour;
        return el("tr", { "data-endpoint": e.origin }, [
          el("td", {}, [link(root.getAttribute("data-endpoint-url") + e.id + "/change/", e.origin)]),
          el("td", { "class": "c-endpoint-state" }, [el("span", { "class": "a2a-chip a2a-" + e.state }, [e.state])]),
          td(hour.attempts ? Math.round(hour.succeeded * 100 / hour.attempts) + "% of " + hour.attempts : "no attempts", "c-rate c-num"),
          td(hour.attempts ? Math.round(hour.meanLatencyMs) + " ms mean" : "–", "c-latency"),
          td(e.consecutiveFailures, "c-failures c-num"), el("td", { "class": "c-paused" }, paused),
          el("td", {}, [when(e.lastFailureAt)])]);
      }), "no endpoint yet: one appears with a task's first push config", 7);
    }
    if (data.alerts) {
      setText("dash-alerts-open", data.alerts.open);
      fill("dash-alert-rows", data.alerts.newest.map(function (a) {
        return el("tr", { "data-alert": String(a.id) },
          [el("td", {}, [link(root.getAttribute("data-alert-url") + a.id + "/change/", a.title)]), td(a.message), td("×" + a.count), el("td", {}, [when(a.lastSeenAt)])]);
      }), "none", 4);
    }
    if (data.rebinds) {
      var base = root.getAttribute("data-rebind-url");
      setText("dash-rebinds-open", data.rebinds.length);
      fill("dash-rebind-rows", data.rebinds.map(function (rb) {
        var text = rb.done + " / " + rb.plannedMoves + (rb.planningDone ? "" : "+") + " (" + rb.percent + "%)";
        return el("tr", { "data-rebind": rb.id }, [
          el("td", {}, [el("a", { href: base + rb.id + "/change/" }, [rb.id.slice(0, 8) + "…"])]),
          td(rb.agent), td(rb.stateLabel), td(rb.policy),
          el("td", { "class": "c-progress" }, [el("progress", { max: "100", value: String(rb.percent) }), " ",
            el("span", { "class": "c-progress-text" }, [text])]),
          td(rb.onOldVersion, "c-on-old"), el("td", { "class": "c-deadline" }, rb.startsAt ? ["starts ", when(rb.startsAt)] : [when(rb.deadline)])]);
      }), "none", 7);
    }
  }

  function start() {
    var root = document.getElementById("dashboard");
    var initial = document.getElementById("dashboard-data");
    if (!root || !initial) { return; }
    var data = JSON.parse(initial.textContent);
    render(root, data);
    window.a2aConsole.poll(root, "dash-poll-status", 5000, function (fresh) { render(root, fresh); });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
