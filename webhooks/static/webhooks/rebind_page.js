/* The rebind's page (templates/admin/webhooks/rebind/change_form.html): renders everything
   that changes as the rebind runs from ONE payload (webhooks/rebinds/console.py), first the one
   the page was rendered with, then each answer of the rebind's JSON view (data-url), polled
   every data-interval-ms: the heading and window title, the state chip and fact, the facts and
   counts, the progress (its tone: only a completed rebind is a success), the deadline (a
   countdown only while the rebind is open), the list of tasks still on the old version (rows
   leave as their tasks move or finish; a checked row stays checked; a row whose notice
   dead-lettered says so, with the receiver's answer, and offers "Replay notice"), the list of
   every move, and which buttons the rebind's state allows. No library, no build step (as
   dashboard.js). */
(function () {
  "use strict";

  // Shared with the other live page (console_common.js, loaded first).
  var el = window.a2aConsole.el;
  var setText = window.a2aConsole.setText;

  function duration(seconds) {
    var s = Math.max(0, Math.floor(seconds)), h = Math.floor(s / 3600);
    var m = Math.floor((s % 3600) / 60), rest = s % 60;
    if (h) { return h + " h " + m + " min " + rest + " s"; }
    if (m) { return m + " min " + rest + " s"; }
    return rest + " s";
  }

  // An ISO time in the console's one format: "21:13:20 UTC · 2 min ago".
  var whenText = window.a2aConsole.whenText;

  function lastDelivery(d) {
    if (!d) { return "none"; }
    var outcome = d.state + (d.status ? " (HTTP " + d.status + ")" : "") + (d.error ? ": " + d.error : "");
    return whenText(d.at) + ": " + d.kind + " " + outcome;
  }

  // The receiver's last answer to a notice: "HTTP 400: {…}" (or the failure in words).
  function answer(a) {
    if (!a) { return ""; }
    var head = a.status !== null && a.status !== undefined ? "HTTP " + a.status : a.detail;
    return a.excerpt ? head + ": " + a.excerpt : head;
  }

  function noticeText(n) {
    if (!n) { return "not written yet"; }
    var said = answer(n.answer);
    if (n.dead) { return n.stateLabel + (said ? " (" + said + ")" : ""); }
    return n.stateLabel + (n.lastError ? ": " + n.lastError : "") +
      (said && n.state !== "delivered" ? " (last answer " + said + ")" : "");
  }

  function row(r, root, checked, canRun, actions) {
    var taskUrl = root.getAttribute("data-task-url") + r.task + "/change/";
    var cells = [];
    if (canRun) {
      var box = el("input", { type: "checkbox", name: "move", value: String(r.move), "class": "rb-select" });
      box.checked = checked.hasOwnProperty(String(r.move));
      cells.push(el("td", {}, [box]));
    }
    // A withdrawn (superseded) notice says why in its last error: not a failure.
    var n = r.notice;
    var failing = n && (n.dead || (n.lastError && ["pending", "sending"].indexOf(n.state) >= 0) ||
      (n.answer && n.state !== "delivered"));
    var noticeCell = [noticeText(n)];
    if (r.stuck && canRun && actions.replay_notice) {
      noticeCell.push(el("br", {}), el("button", {
        type: "submit", name: "only", value: String(r.move), "class": "button rb-replay",
        formaction: root.getAttribute("data-replay-url")
      }, ["Replay notice"]));
    }
    cells.push(
      el("td", { "class": "c-task" }, [el("a", { href: taskUrl }, [r.task]), el("br", {}),
        el("small", {}, [r.oldVersion])]),
      el("td", { "class": "c-task-state" }, [r.taskState]),
      el("td", { "class": "c-move" + (r.stuck ? " rb-error" : ""), "data-state": r.moveState,
        "data-stuck": r.stuck ? "1" : "0" }, [r.moveStateLabel]),
      el("td", { "class": "c-notice" + (failing ? " rb-error" : ""),
        "data-notice-state": n ? n.state : "" }, noticeCell),
      el("td", { "class": "c-last-delivery" }, [lastDelivery(r.lastDelivery)]),
      el("td", { "class": "c-since", title: "since " + r.since }, [duration(r.sinceSeconds)])
    );
    return el("tr", { "data-move": String(r.move), "data-task": r.task }, cells);
  }

  function moveRow(m, root) {
    var taskUrl = root.getAttribute("data-task-url") + m.task + "/change/";
    var stuck = m.notice && m.notice.dead && m.state === "notice_pending";
    return el("tr", { "data-move": String(m.move), "data-task": m.task, "data-state": m.state }, [
      el("td", { "class": "c-task" }, [el("a", { href: taskUrl }, [m.task])]),
      el("td", {}, [m.config]),
      el("td", {}, [m.versions]),
      el("td", { "class": "c-move" + (stuck ? " rb-error" : "") }, [m.stateLabel]),
      el("td", { "class": "c-notice" + (m.notice && m.notice.dead ? " rb-error" : "") }, [
        m.notice ? noticeText(m.notice) : "-"]),
      el("td", {}, [whenText(m.finishedAt)])
    ]);
  }

  function countsText(c, p) {
    var parts = [p.start + " planned" + (p.planningDone ? "" : " so far"), c.moved + " moved"];
    if (c.onOldVersionTotal) { parts.push(c.onOldVersionTotal + " on the old version"); }
    if (c.finishingOnOld) { parts.push(c.finishingOnOld + " finishing on old"); }
    if (c.finishedOnOld) { parts.push(c.finishedOnOld + " finished on old"); }
    if (c.orphaned) { parts.push(c.orphaned + " orphaned"); }
    if (c.rebound) { parts.push(c.rebound + " re-bound"); }
    if (c.reverted) { parts.push(c.reverted + " returned to the old channel"); }
    var n = c.notices;
    parts.push("notices: " + n.delivered + " delivered, " + n.pending + " pending, " + n.dead +
      " dead-lettered" + (n.superseded ? ", " + n.superseded + " withdrawn" : ""));
    return parts.join("; ");
  }

  function replaceRows(body, rows, empty, colspan) {
    while (body.firstChild) { body.removeChild(body.firstChild); }
    rows.forEach(function (r) { body.appendChild(r); });
    if (!rows.length) {
      body.appendChild(el("tr", { "class": "rb-empty" }, [el("td", { colspan: colspan }, [empty])]));
    }
  }

  function render(root, data) {
    var canRun = root.getAttribute("data-can-run") === "1";
    // The heading, the breadcrumb and the window's title ("<title> | View rebind | …").
    setText("rebind-title", data.title);
    setText("rebind-crumb", data.title);
    var rest = document.title.indexOf(" | ");
    document.title = data.title + (rest >= 0 ? document.title.slice(rest) : "");
    var chip = document.getElementById("rebind-state-chip");
    chip.textContent = data.stateLabel;
    chip.className = "a2a-chip rb-state rb-" + data.state;
    setText("rebind-state", data.stateLabel);
    setText("rebind-policy-chip", "policy: " + data.policy + (data.finishOnOld ? ", finish on old" : ""));
    setText("rebind-scope-chip", data.scope);
    setText("rebind-in-flight", data.inFlight);
    setText("rebind-started", whenText(data.startedAt));
    setText("rebind-finished", whenText(data.finishedAt));
    setText("rebind-reason-shown", data.reason || "–");
    setText("rebind-counts", countsText(data.counts, data.progress));
    var p = data.progress;
    document.getElementById("rebind-progress").className = "rb-tone-" + p.tone;
    document.getElementById("rebind-progress-bar").value = p.percent;
    setText("rebind-progress-text", p.text);
    var deadline = document.getElementById("rebind-deadline");
    // Only an open rebind's deadline counts down; an ended one's is a date.
    deadline.setAttribute("data-deadline", data.deadlineRunning ? data.deadline : "");
    deadline.textContent = data.deadline ? whenText(data.deadline) : "none";
    setText("rebind-deadline-then", data.open || !data.deadline ? "" : "(no longer counts: " + data.stateLabel + ")");
    setText("rebind-generated", whenText(data.generatedAt));
    setText("rebind-on-old-count", data.onOldTotal);
    setText("rebind-stuck-count", p.stuck);

    var body = document.getElementById("rebind-on-old-rows");
    var checked = {};
    Array.prototype.forEach.call(body.querySelectorAll("input.rb-select:checked"), function (b) {
      checked[b.value] = true;
    });
    replaceRows(body, data.onOld.map(function (r) { return row(r, root, checked, canRun, data.actions); }),
      "no task is on the old version", canRun ? "7" : "6");
    var more = data.onOldTotal - data.onOld.length;
    setText("rebind-on-old-more", more > 0 ? "and " + more + " more (the oldest are listed)" : "");

    replaceRows(document.getElementById("rebind-moves-rows"),
      data.moves.map(function (m) { return moveRow(m, root); }), "no move planned yet", "6");
    setText("rebind-moves-count", data.movesTotal);
    var moreMoves = data.movesTotal - data.moves.length;
    setText("rebind-moves-more", moreMoves > 0 ? "and " + moreMoves + " more (the oldest are listed)" : "");

    Array.prototype.forEach.call(document.querySelectorAll("#rebind-buttons button[data-action]"), function (b) {
      var legal = data.actions[b.getAttribute("data-action")];
      b.disabled = !legal || (b.getAttribute("data-needs-stuck") === "1" && !p.stuck);
    });
    tick();
  }

  function tick() {
    var deadline = document.getElementById("rebind-deadline");
    var out = document.getElementById("rebind-countdown");
    if (!deadline || !out) { return; }
    var iso = deadline.getAttribute("data-deadline");
    if (!iso) {
      out.textContent = "";
      out.removeAttribute("data-seconds-left");
      out.className = "";
      return;
    }
    var left = (Date.parse(iso) - Date.now()) / 1000;
    out.setAttribute("data-seconds-left", String(Math.round(left)));
    if (left <= 0) {
      out.textContent = "overdue by " + duration(-left);
      out.className = "rb-overdue";
    } else {
      out.textContent = "in " + duration(left);
      out.className = "";
    }
  }

  function start() {
    var root = document.getElementById("rebind-console");
    var initial = document.getElementById("rebind-console-data");
    if (!root || !initial) { return; }
    render(root, JSON.parse(initial.textContent));
    window.setInterval(tick, 1000);
    var all = document.getElementById("rebind-select-all");
    if (all) {
      all.addEventListener("change", function () {
        Array.prototype.forEach.call(document.querySelectorAll("input.rb-select"), function (b) {
          b.checked = all.checked;
        });
      });
    }
    window.a2aConsole.poll(root, "rebind-poll-status", 3000, function (fresh) { render(root, fresh); });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
