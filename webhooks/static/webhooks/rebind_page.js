/* The rebind's page (templates/admin/webhooks/rebind/change_form.html): renders the list of
   tasks still on the old version from the data the page was rendered with, then polls the
   rebind's JSON view (data-url) every data-interval-ms and re-renders the chips, the
   progress, the list (rows leave as their tasks move or finish; a checked row stays checked)
   and which buttons the rebind's state allows. The countdown ticks every second from the
   deadline's ISO time. No library, no build step (as dashboard.js). */
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

  // An ISO time as the admin's exact_time shows it: "2026-12-01 21:13:20.188 UTC".
  function exact(iso) {
    if (!iso) { return "–"; }
    return iso.replace("T", " ").replace(/(\.\d{3})\d*/, "$1").replace(/\+00:00$/, " UTC");
  }

  function lastDelivery(d) {
    if (!d) { return "none"; }
    var outcome = d.state + (d.status ? " (HTTP " + d.status + ")" : "") + (d.error ? ": " + d.error : "");
    return exact(d.at) + ": " + d.kind + " " + outcome;
  }

  function row(r, root, checked, canRun) {
    var taskUrl = root.getAttribute("data-task-url") + r.task + "/change/";
    var cells = [];
    if (canRun) {
      var box = el("input", { type: "checkbox", name: "move", value: String(r.move), "class": "rb-select" });
      box.checked = checked.hasOwnProperty(String(r.move));
      cells.push(el("td", {}, [box]));
    }
    // A withdrawn (superseded) notice says why in its last error: not a failure.
    var failing = r.notice && r.notice.lastError && ["pending", "sending", "dead"].indexOf(r.notice.state) >= 0;
    var notice = r.notice ? r.notice.state + (r.notice.lastError ? ": " + r.notice.lastError : "") : "not written yet";
    cells.push(
      el("td", { "class": "c-task" }, [el("a", { href: taskUrl }, [r.task]), el("br", {}),
        el("small", {}, [r.oldVersion])]),
      el("td", { "class": "c-task-state" }, [r.taskState]),
      el("td", { "class": "c-move", "data-state": r.moveState }, [r.moveStateLabel]),
      el("td", { "class": "c-notice" + (failing ? " rb-error" : "") }, [notice]),
      el("td", { "class": "c-last-delivery" }, [lastDelivery(r.lastDelivery)]),
      el("td", { "class": "c-since", title: "since " + r.since }, [duration(r.sinceSeconds)])
    );
    return el("tr", { "data-move": String(r.move), "data-task": r.task }, cells);
  }

  function render(root, data) {
    var canRun = root.getAttribute("data-can-run") === "1";
    var chip = document.getElementById("rebind-state-chip");
    chip.textContent = data.stateLabel;
    chip.className = "a2a-chip rb-state rb-" + data.state;
    setText("rebind-policy-chip", "policy: " + data.policy + (data.finishOnOld ? ", finish on old" : ""));
    setText("rebind-scope-chip", data.scope);
    var p = data.progress;
    document.getElementById("rebind-progress-bar").value = p.percent;
    setText("rebind-progress-text", p.left + " of " + p.start + (p.planningDone ? "" : "+") +
      " left on the old version");
    var deadline = document.getElementById("rebind-deadline");
    deadline.setAttribute("data-deadline", data.deadline || "");
    deadline.textContent = data.deadline ? exact(data.deadline) : "none";
    setText("rebind-generated", exact(data.generatedAt));
    setText("rebind-on-old-count", data.onOldTotal);

    var body = document.getElementById("rebind-on-old-rows");
    var checked = {};
    Array.prototype.forEach.call(body.querySelectorAll("input.rb-select:checked"), function (b) {
      checked[b.value] = true;
    });
    while (body.firstChild) { body.removeChild(body.firstChild); }
    data.onOld.forEach(function (r) { body.appendChild(row(r, root, checked, canRun)); });
    if (!data.onOld.length) {
      body.appendChild(el("tr", { "class": "rb-empty" }, [
        el("td", { colspan: canRun ? "7" : "6" }, ["no task is on the old version"])]));
    }
    var more = data.onOldTotal - data.onOld.length;
    setText("rebind-on-old-more", more > 0 ? "and " + more + " more (the oldest are listed)" : "");

    Array.prototype.forEach.call(document.querySelectorAll("#rebind-buttons button[data-action]"), function (b) {
      b.disabled = !data.actions[b.getAttribute("data-action")];
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
