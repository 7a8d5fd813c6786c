// RL Export page: the Label, Compare, My labels, Review, Rubric, Export and Agreement tabs over
// /api/v1 (the Compare tab's own code is compare.js, given this file's helpers as window.RLX).
// No framework, no build step. Every piece of data is put on the page as text (textContent /
// text nodes), never as HTML: transcripts are untrusted. The one exception is the project's
// guidelines, which the service renders from Markdown to HTML that runs nothing (raw HTML off,
// http(s) links only: labeling/guidelines.py), put in with innerHTML; the page's
// Content-Security-Policy runs no inline script whatever happens.
"use strict";

(() => {
  const config = JSON.parse(document.getElementById("rl-config").textContent);
  const API = `/api/v1/${encodeURIComponent(config.org)}/${encodeURIComponent(config.project)}/`;
  const TOKEN_KEY = `rl-export-token:${config.org}/${config.project}`;
  const $ = (id) => document.getElementById(id);

  // --- DOM helper: attributes, events and text children only --------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function toast(text) {
    const box = $("toast");
    box.textContent = text;
    box.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { box.hidden = true; }, 4000);
  }

  // --- the token: asked for once, kept in this browser ---------------------------------
  let token = localStorage.getItem(TOKEN_KEY);

  class ApiError extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  async function api(path, { method = "GET", body, raw = false } = {}) {
    const headers = { Authorization: `Bearer ${token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(API + path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) {
      let detail = response.statusText;
      let code = null;
      try {
        const answer = await response.json();
        code = answer.error || null;
        detail = answer.detail || answer.error || detail;
      } catch (_) { /* not JSON: keep the status text */ }
      if (response.status === 401) askToken(`The token was not accepted: ${detail}`);
      if (code === "raw_required") document.dispatchEvent(new CustomEvent("rl-raw-required"));
      throw new ApiError(response.status, detail);
    }
    return raw ? response : response.json();
  }

  function askToken(message) {
    $("token-panel").hidden = false;
    for (const name of TAB_NAMES) $(`panel-${name}`).hidden = true;
    $("who").hidden = true;
    const error = $("token-error");
    error.hidden = !message;
    error.textContent = message || "";
    $("token-input").value = "";
    $("token-input").focus();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token-input").value.trim();
    if (!value) return;
    token = value;
    localStorage.setItem(TOKEN_KEY, value);
    start();
  });

  $("forget-token").addEventListener("click", () => {
    // The claim is the old token's subject's: give it back while the token still works.
    serial(pause).finally(() => {
      localStorage.removeItem(TOKEN_KEY);
      token = null;
      label.me = null;
      label.current = null;
      label.last = null;
      showUndo();
      askToken("");
    });
  });

  // --- tabs ------------------------------------------------------------------------------
  const TAB_NAMES = ["label", "compare", "mylabels", "review", "rubric", "export", "agreement"];
  // The Compare tab (compare.js): entered and left with the tab, given its keys.
  const compareTab = () => window.RLXCompare || { enter() {}, leave() {}, key() {} };
  const tabs = TAB_NAMES.map((name) => $(`tab-${name}`));
  let activeTab = TAB_NAMES.includes(location.hash.slice(1)) ? location.hash.slice(1) : "label";

  function shownTabs() { return TAB_NAMES.filter((name) => !$(`tab-${name}`).hidden); }

  function selectTab(name, focus) {
    if ($(`tab-${name}`).hidden) name = "label";
    activeTab = name;
    for (const tab of tabs) {
      const selected = tab.id === `tab-${name}`;
      tab.setAttribute("aria-selected", String(selected));
      tab.tabIndex = selected ? 0 : -1;
      $(tab.getAttribute("aria-controls")).hidden = !selected || !token;
      if (selected && focus) tab.focus();
    }
    history.replaceState(null, "", `#${name}`);
    if (name === "export") refreshExport();
    if (name === "agreement") refreshAgreement();
    if (name === "mylabels") loadMyLabels(false);
    if (name === "rubric") showRubricTab();
    if (name === "review") enterReview();
    else serial(releaseReview);
    if (name === "compare" && token) compareTab().enter(label.me);
    else compareTab().leave();
    // Only the Label tab holds a trace: leaving it gives the claim back at once.
    if (token && label.me) {
      if (name === "label") enterLabel();
      else serial(pause);
    }
    // From the tab list the focus stays on the tab (the shortcuts work from there); a click
    // takes it to the ratings.
    if (name === "label" && !focus) label.form.focus(label.form.focused);
  }

  for (const tab of tabs) {
    tab.addEventListener("click", () => selectTab(tab.id.slice(4), false));
    tab.addEventListener("keydown", (event) => {
      if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
        event.preventDefault();
        event.stopPropagation();
        const names = shownTabs();
        const step = event.key === "ArrowRight" ? 1 : names.length - 1;
        selectTab(names[(names.indexOf(activeTab) + step) % names.length], true);
      }
    });
  }

  // =====================================================================================
  // Label tab
  // =====================================================================================
  const { QuestionForm, rewardOf, answersOf, answerText } = window.RLXForms;
  const label = {
    queue: [], remaining: 0, current: null, busy: false, done: new Set(), claim: null,
    team: null, labeled: 0, settings: null, scope: {},
    me: null, // GET whoami: {subject, org, project, scopes}
    mayLabel: false, // the token has label (or admin)
    started: false, // labeling: an admin starts it with a click, a labeler by opening the tab
    last: null, // what U undoes: {kind: "save" | "skip", record, answers, rubric}
    hiddenTimer: null,
    rubric: null, // GET rubric: the newest version, its questions and guidelines
    reopened: null, // the trace shown from My labels or by its id: {labeled}
  };
  // A tab hidden this long gives its claim back (Page Visibility); it claims again when seen.
  const HIDDEN_RELEASE_MS = 60000;
  // Counts, settings and the rubric follow the team while the Label tab is open.
  const TEAM_REFRESH_MS = 15000;
  // A claim this close to its end is renewed before a save rather than trusted.
  const CLAIM_MARGIN_MS = 2000;

  label.form = new QuestionForm($("dimensions"), {
    prefix: "label",
    onChange: () => { $("rate-error").hidden = true; showReward(); },
  });
  label.form.active = () => activeTab === "label" && Boolean(label.current) && !$("panel-label").hidden;

  function threshold() {
    const record = label.current;
    return record && typeof record.pass_threshold === "number"
      ? record.pass_threshold : config.pass_threshold;
  }

  function showReward() {
    const form = label.form;
    const verdict = $("reward-verdict");
    const missing = form.missing();
    if (missing >= 0) {
      const required = form.rubric.questions.filter((q) => q.required).length;
      const given = form.rubric.questions.filter((q) => q.required
        && form.answers[q.name] !== undefined && form.answers[q.name] !== "").length;
      $("reward-value").textContent = "–";
      verdict.className = "verdict";
      verdict.textContent = `answer every required question (${given}/${required})`;
      return;
    }
    const reward = form.reward();
    if (reward === null) {
      $("reward-value").textContent = "–";
      verdict.textContent = "";
      return;
    }
    const passed = reward >= threshold();
    $("reward-value").textContent = reward.toFixed(2);
    verdict.className = `verdict ${passed ? "pass" : "fail"}`;
    verdict.textContent = `${passed ? "Pass" : "Fail"} (threshold ${threshold().toFixed(2)})`;
  }

  // The guidelines beside the item (the service's HTML: see the top of this file).
  function showGuidelines() {
    const html = label.rubric ? label.rubric.guidelines_html : "";
    $("guidelines-box").hidden = !html;
    $("guidelines").innerHTML = html || "";
  }

  // GET rubric: the newest version. A change shows from the next trace on (the one on the
  // page keeps the version it was shown with, and is saved with it).
  async function loadRubric() {
    try {
      const rubric = await api("rubric");
      const changed = !label.rubric || label.rubric.version !== rubric.version;
      label.rubric = rubric;
      if (changed) {
        showGuidelines();
        if (!label.current) label.form.render(rubric, {});
      }
    } catch (error) {
      if (error.status !== 401 && error.status !== 403) toast(`Could not load the rubric: ${error.message}`);
    }
  }

  // --- the transcript ------------------------------------------------------------------
  const LONG_CHARS = 700;
  const LONG_LINES = 10;

  function textBlock(text) {
    const block = h("div", { class: "text" }, text);
    if (text.length <= LONG_CHARS && text.split("\n").length <= LONG_LINES) return block;
    block.classList.add("collapsed");
    const toggle = h("button", { type: "button", class: "link toggle", "aria-expanded": "false" },
      "Show all");
    toggle.addEventListener("click", () => {
      const open = block.classList.toggle("collapsed") === false;
      toggle.setAttribute("aria-expanded", String(open));
      toggle.textContent = open ? "Show less" : "Show all";
    });
    return h("div", {}, block, toggle);
  }

  function jsonBlock(value) {
    return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
  }

  function maybeJson(text) {
    if (typeof text !== "string") return null;
    const trimmed = text.trim();
    if (!(trimmed.startsWith("{") || trimmed.startsWith("["))) return null;
    try { return JSON.parse(trimmed); } catch (_) { return null; }
  }

  function contentNodes(content) {
    if (content === null || content === undefined) return [];
    if (typeof content === "string") {
      const parsed = maybeJson(content);
      return [parsed !== null && content.length < 4000 ? jsonBlock(parsed) : textBlock(content)];
    }
    if (Array.isArray(content)) {
      return content.map((part) => {
        if (part && typeof part === "object" && typeof part.text === "string") {
          return h("div", { class: "part" }, textBlock(part.text));
        }
        const kind = part && typeof part === "object" && part.type ? String(part.type) : typeof part;
        return h("div", { class: "part" }, h("span", { class: "part-kind" }, kind), jsonBlock(part));
      });
    }
    return [jsonBlock(content)];
  }

  function toolCallNodes(calls) {
    if (!Array.isArray(calls)) return [];
    return calls.map((call) => {
      const fn = (call && call.function) || {};
      const name = fn.name || (call && call.name) || "tool call";
      const args = fn.arguments !== undefined ? fn.arguments : call && call.arguments;
      const parsed = typeof args === "string" ? maybeJson(args) : args;
      return h("div", { class: "tool-call" },
        h("div", {}, h("span", { class: "part-kind" }, "calls "), h("span", { class: "fn" }, name),
          call && call.id ? h("span", { class: "msg-name" }, `  ${call.id}`) : null),
        parsed !== null && parsed !== undefined ? jsonBlock(parsed)
          : args !== undefined ? textBlock(String(args)) : null);
    });
  }

  const KNOWN = new Set(["role", "content", "name", "tool_calls", "tool_call_id"]);

  function renderMessages(messages, list = $("messages")) {
    list.replaceChildren();
    (Array.isArray(messages) ? messages : []).forEach((message, index) => {
      const m = message && typeof message === "object" ? message : { role: "?", content: message };
      const role = String(m.role || "?");
      const head = h("div", { class: "msg-head" },
        h("span", { class: `role role-${role}` }, role === "tool" ? "tool result" : role),
        m.name ? h("span", { class: "msg-name" }, String(m.name)) : null,
        m.tool_call_id ? h("span", { class: "msg-name" }, `for ${m.tool_call_id}`) : null);
      const body = [...contentNodes(m.content), ...toolCallNodes(m.tool_calls)];
      if (!body.length) body.push(h("div", { class: "muted" }, "(no content)"));
      const extra = Object.keys(m).filter((k) => !KNOWN.has(k));
      if (extra.length) {
        const rest = {};
        for (const key of extra) rest[key] = m[key];
        body.push(h("details", {}, h("summary", { class: "muted" }, `other fields: ${extra.join(", ")}`),
          jsonBlock(rest)));
      }
      list.append(h("li", { class: `msg ${role}`, "aria-label": `message ${index + 1}, ${role}` },
        head, ...body));
    });
  }

  // The project's labeling setting show_evaluations: after_label (the default) hides the
  // evaluators' verdict until the labeler saved a label on the trace (no anchoring).
  function evaluationsHidden(record) {
    const setting = label.settings ? label.settings.show_evaluations : "after_label";
    return record.evaluation === null && setting !== "always";
  }

  function renderEvaluator(record, box = $("evaluator"), { others = true } = {}) {
    box.replaceChildren();
    const evaluation = record.evaluation;
    const results = evaluation && Array.isArray(evaluation.results) ? evaluation.results : [];
    const setting = label.settings ? label.settings.show_evaluations : "after_label";
    if (evaluationsHidden(record)) {
      box.append(h("p", { class: "muted hidden-verdict" }, setting === "never"
        ? "The evaluators' verdict is not shown in this project."
        : "Hidden until you save your label, so that it does not sway you."));
    } else if (!results.length) {
      box.append(h("p", { class: "muted" }, "Not evaluated yet."));
    } else {
      const passed = results.every((r) => r.passed === true);
      const mean = results.reduce((a, r) => a + Number(r.score || 0), 0) / results.length;
      box.append(h("div", { class: "eval-summary" },
        h("span", {}, "Mean score ", h("span", { class: "score" }, mean.toFixed(2))),
        h("span", { class: `badge ${passed ? "pass" : "fail"}` }, passed ? "PASS" : "FAIL")));
      for (const result of results) {
        box.append(h("div", { class: "eval-row" },
          h("span", { class: "eval-name" }, String(result.evaluator)),
          h("span", {}, h("span", { class: "score" }, Number(result.score).toFixed(2)), " ",
            h("span", { class: `badge ${result.passed ? "pass" : "fail"}` }, result.passed ? "pass" : "fail"))));
        if (result.reasoning) box.append(h("p", { class: "reasoning" }, String(result.reasoning)));
      }
      const outcomes = evaluation.report && Array.isArray(evaluation.report.outcomes)
        ? evaluation.report.outcomes : [];
      if (outcomes.length) {
        box.append(h("p", { class: "reasoning" }, outcomes.map((o) => {
          const decision = o.decision === null || o.decision === undefined ? "undecided"
            : o.decision ? "yes" : "no";
          return `${o.type}: ${decision}${o.severity ? ` (severity ${o.severity})` : ""}`;
        }).join(" · ")));
      }
    }
    if (!others) return;
    const labels = record.labels_count || 0;
    box.append(h("p", { class: "reasoning" }, record.labels_count === null
      ? "Blind labeling: other labelers' labels are hidden."
      : labels ? `${labels} human label${labels === 1 ? "" : "s"} so far`
        : "No human label yet."));
  }

  // After a save: the saved trace's evaluator verdict, now that the labeler has labeled it.
  async function showLastEvaluator(traceId) {
    const box = $("last-evaluator");
    try {
      const answer = await api(`traces/${encodeURIComponent(traceId)}`);
      if (!answer.evaluations_shown) { box.hidden = true; return; }
      const inner = h("div", {});
      renderEvaluator(answer.item, inner, { others: false });
      box.replaceChildren(h("h3", {}, "Your last trace: ", h("span", { class: "tag" }, traceId)), inner);
      box.hidden = false;
    } catch (_) {
      box.hidden = true;
    }
  }

  function showCounts() {
    $("queue-count").textContent = `${label.remaining} left in your queue`;
    const k = label.settings ? label.settings.labels_per_trace : null;
    $("team-count").textContent = label.team === null ? ""
      : `Team: ${label.team} trace${label.team === 1 ? "" : "s"} short of ${k === null ? "their target" : `${k} label${k === 1 ? "" : "s"} each`}`;
    $("own-count").textContent = `You: ${label.labeled} labeled`;
    showClaim();
  }

  function claimLeft(claim) {
    return Date.parse(claim.expires_at) - Date.now();
  }

  // Whether the page holds an unexpired claim on the trace it shows (with a margin: a claim
  // about to end is taken again before a save, never trusted).
  function claimHeld() {
    const claim = label.claim;
    return Boolean(claim && label.current && claim.trace_id === label.current.trace_id
      && claimLeft(claim) > CLAIM_MARGIN_MS);
  }

  function showClaim() {
    const box = $("claim-info");
    const claim = label.claim;
    if (!claim || !label.current || claim.trace_id !== label.current.trace_id) {
      box.hidden = true;
      return;
    }
    const left = Math.round(claimLeft(claim) / 1000);
    const until = new Date(claim.expires_at).toLocaleTimeString();
    box.hidden = false;
    box.classList.toggle("expired", left <= 0);
    box.textContent = left > 0
      ? `Claimed for you until ${until} (${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")} left)`
      : `Your claim ended at ${until}: saving claims it again first`;
  }
  setInterval(showClaim, 1000);

  function showPanel(which) {
    $("label-start").hidden = which !== "start";
    $("label-empty").hidden = which !== "empty";
    $("label-work").hidden = which !== "work";
  }

  function showCurrent() {
    const record = label.current;
    showCounts();
    if (!record) {
      showPanel("empty");
      const held = label.team !== null && label.team > 0 && label.remaining === 0;
      $("label-empty-title").textContent = held ? "Nothing to claim right now" : "Your queue is empty";
      $("label-empty-text").textContent = held
        ? "What is left is claimed by teammates or already labeled by you. Claims that expire come back here."
        : `Every trace of ${config.org}/${config.project} is labeled or skipped by you, or has its labels. New traces appear here as they arrive.`;
      return;
    }
    showPanel("work");
    const meta = $("trace-meta");
    meta.replaceChildren(
      h("span", { class: "tag", title: "trace id" }, record.trace_id),
      h("span", { class: "tag" }, record.scenario),
      h("span", { class: "tag" }, record.agent_version));
    $("trace-title").textContent = "Trajectory";
    renderMessages(record.messages);
    renderEvaluator(record);
    const mode = $("rate-mode");
    const reopened = label.reopened && label.reopened.trace_id === record.trace_id ? label.reopened : null;
    mode.hidden = !reopened;
    mode.textContent = !reopened ? ""
      : reopened.labeled ? "Your label, as you saved it: a new save replaces it."
        : "Opened by its id: a save labels it like any trace of your queue.";
    label.form.render(label.shown || label.rubric, label.prefill ? label.prefill.answers : null);
    $("comment").value = label.prefill ? label.prefill.comment || "" : "";
    $("rate-error").hidden = true;
    showReward();
    label.prefill = null;
    label.shown = null;
    label.form.focus(0);
  }

  // --- when the page holds a trace ----------------------------------------------------------
  // One claim at a time, and only while someone labels: the Label tab shown, the browser tab
  // visible, and (for an admin, who may have come for the settings) after "Start labeling".
  // Every step that claims or gives back runs after the previous one (serial), so a quick
  // switch of tabs never leaves a claim behind.
  let labelWork = Promise.resolve();

  function serial(step) {
    const run = labelWork.then(step, step);
    labelWork = run.catch(() => {});
    return run;
  }

  function labeling() {
    return Boolean(token && label.mayLabel && label.started && activeTab === "label"
      && document.visibilityState === "visible");
  }

  // PUT queue/claims/{id}: the claim on one named trace; null when every place is held.
  async function claimTrace(traceId) {
    try {
      return await api(`queue/claims/${encodeURIComponent(traceId)}`, { method: "PUT" });
    } catch (error) {
      if (error.status === 409) return null;
      throw error;
    }
  }

  async function giveBack(traceId) {
    try {
      await api(`queue/claims/${encodeURIComponent(traceId)}`, { method: "DELETE" });
    } catch (_) { /* expired already, or taken over: nothing is held */ }
  }

  // Leave the trace (another tab, a hidden browser tab): its claim goes back to the team; the
  // ratings typed so far stay on the page.
  async function pause() {
    const claim = label.claim;
    label.claim = null;
    showClaim();
    if (claim && claimLeft(claim) > 0) await giveBack(claim.trace_id);
  }

  // Back to labeling: the trace on the page is claimed again (the ratings kept) or, when a
  // teammate took its place meanwhile, the next one.
  async function resume() {
    if (!labeling()) return;
    if (!label.current) {
      await loadQueue();
      return;
    }
    if (claimHeld()) return;
    const record = label.current;
    let got;
    try {
      got = await claimTrace(record.trace_id);
    } catch (error) {
      if (error.status !== 401) toast(`Could not claim ${record.trace_id} again: ${error.message}`);
      return;
    }
    if (label.current !== record) return;
    if (got) {
      label.claim = got;
      showClaim();
      return;
    }
    toast(`A teammate took ${record.trace_id} while you were away: here is the next trace.`);
    label.current = null;
    await loadQueue();
  }

  function enterLabel() {
    if (!label.mayLabel) {
      $("queue-count").textContent = "This token cannot label (no label scope)";
      showPanel(null);
      return;
    }
    if (!label.started) {
      showStart();
      return;
    }
    serial(resume);
  }

  async function showStart() {
    showPanel("start");
    $("claim-info").hidden = true;
    await refreshCounts();
  }

  $("label-start-button").addEventListener("click", () => {
    label.started = true;
    $("queue-count").textContent = "Loading your queue…";
    serial(resume);
  });

  document.addEventListener("visibilitychange", () => {
    clearTimeout(label.hiddenTimer);
    label.hiddenTimer = null;
    if (document.visibilityState === "hidden") {
      label.hiddenTimer = setTimeout(() => { serial(pause); }, HIDDEN_RELEASE_MS);
    } else if (labeling()) {
      serial(resume);
    }
  });
  // Closing the page gives the claim back too (best effort: the lease ends it otherwise).
  window.addEventListener("pagehide", () => {
    const claim = label.claim;
    if (!claim || !token) return;
    fetch(`${API}queue/claims/${encodeURIComponent(claim.trace_id)}`, {
      method: "DELETE", headers: { Authorization: `Bearer ${token}` }, keepalive: true,
    }).catch(() => {});
  });

  // The page claims one trace at a time (POST queue/claim): it is held for this labeler until
  // the lease ends, and a label or a skip ends the claim.
  async function loadQueue() {
    if (!labeling()) return;
    try {
      const body = await api("queue/claim", { method: "POST", body: { limit: 1, ...label.scope } });
      label.queue = body.items.filter((r) => !label.done.has(r.trace_id));
      label.claim = body.claims.length ? body.claims[0] : null;
      label.remaining = body.remaining;
      label.team = body.team_remaining;
      label.labeled = body.labeled;
    } catch (error) {
      if (error.status === 403) {
        $("queue-count").textContent = "This token cannot label (no label scope)";
        showPanel(null);
        return;
      }
      if (error.status !== 401) toast(`Could not load the queue: ${error.message}`);
      return;
    }
    label.current = label.queue.shift() || null;
    if (!labeling()) {  // left while the claim was on its way: give it back
      await pause();
      return;
    }
    showCurrent();
  }

  // The counts alone (GET queue claims nothing): after a settings change and on a timer.
  async function refreshCounts() {
    if (!token || !label.mayLabel) return;
    try {
      const body = await api(`queue?${new URLSearchParams({ limit: "1", ...label.scope })}`);
      label.remaining = body.remaining;
      label.team = body.team_remaining;
      label.labeled = body.labeled;
      showCounts();
    } catch (error) {
      if (error.status !== 401 && error.status !== 403) toast(`Could not count the queue: ${error.message}`);
    }
  }

  setInterval(() => {
    if (!token || !label.me || activeTab !== "label" || document.visibilityState !== "visible") return;
    loadSettings(true).then(loadRubric).then(refreshCounts);
  }, TEAM_REFRESH_MS);

  // --- the queue's filter and the team's settings ------------------------------------------
  function formValues(form) {
    const values = {};
    for (const field of form.querySelectorAll("input, select")) {
      if (field.value !== "") values[field.name] = field.value;
    }
    return values;
  }

  $("queue-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const values = formValues($("queue-form"));
    label.scope = {};
    if (values.scenario) label.scope.scenario = values.scenario;
    if (values.agent_version) label.scope.agent_version = values.agent_version;
    if (values.passed) label.scope.passed = values.passed === "true";
    const count = Object.keys(label.scope).length;
    $("queue-summary").textContent = count ? `(${count} filter${count === 1 ? "" : "s"})` : "";
    serial(async () => {
      await pause();  // give back the trace held under the old filter
      label.current = null;
      label.queue = [];
      if (labeling()) await loadQueue();
      else await refreshCounts();
    });
  });

  // The form stays disabled until the settings arrived (the HTML starts it so): nothing typed
  // before then is overwritten by them. ``quiet``: a refresh on the timer, which leaves alone
  // a form the admin is editing.
  function showSettings(settings, quiet) {
    label.settings = settings;
    const form = $("labeling-form");
    if (!(quiet && form.contains(document.activeElement))) {
      for (const field of form.querySelectorAll("input, select")) {
        const value = settings[field.name];
        field.value = value === null || value === undefined ? "" : String(value);
        field.disabled = !settings.editable;
      }
    }
    $("labeling-save").hidden = !settings.editable;
    $("labeling-note").textContent = settings.editable
      ? "Applies to the whole team within seconds."
      : "Set by an admin of this project.";
    showCounts();
  }

  async function loadSettings(quiet) {
    try {
      showSettings(await api("labeling"), quiet);
    } catch (error) {
      if (!quiet && error.status !== 401 && error.status !== 403) toast(`Could not load the team settings: ${error.message}`);
    }
  }

  $("labeling-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = formValues($("labeling-form"));
    const body = {
      labels_per_trace: Number(values.labels_per_trace),
      lease_s: Number(values.lease_s),
      order: values.order,
      adjudicate_spread: values.adjudicate_spread === undefined ? null : Number(values.adjudicate_spread),
      show_evaluations: values.show_evaluations || "after_label",
      pair_on: values.pair_on || "prompt",
      pair_versions: values.pair_versions || "different",
      comparisons_per_pair: Number(values.comparisons_per_pair || 1),
    };
    const error = $("labeling-error");
    try {
      showSettings(await api("labeling", { method: "PUT", body }));
      error.hidden = true;
      toast("Team settings saved.");
    } catch (failure) {
      error.textContent = `Not saved: ${failure.message}`;
      error.hidden = false;
      return;
    }
    await refreshCounts();  // the team's count follows the new target at once
  });

  // --- save, skip, undo ----------------------------------------------------------------------
  function rewardText(last) {
    const value = rewardOf(last.rubric, last.answers);
    return value === null ? "–" : value.toFixed(2);
  }

  function showUndo() {
    const last = label.last;
    $("undo-line").hidden = !last;
    if (!last) return;
    const id = last.record.trace_id;
    $("undo-text").textContent = last.kind === "save"
      ? `Saved ${id} (reward ${rewardText(last)}).` : `Skipped ${id}.`;
    $("undo-what").textContent = last.kind === "save" ? "Undo save" : "Undo skip";
    $("undo").setAttribute("aria-label", `${last.kind === "save" ? "Undo the save of" : "Undo the skip of"} ${id} (U)`);
  }

  // Asks before a label that would count over the team's target; resolves true to save.
  function confirmOverTarget(record) {
    const dialog = $("over-dialog");
    const k = label.settings ? label.settings.labels_per_trace : null;
    $("over-text").textContent = `Your claim on ${record.trace_id} lapsed and its place is held by `
      + `a teammate now. Saving would count your label over the team's target`
      + `${k === null ? "" : ` (${k} label${k === 1 ? "" : "s"} per trace)`}.`;
    dialog.returnValue = "";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "save"), { once: true });
      dialog.showModal();
      $("over-cancel").focus();
    });
  }

  // The answers to save, or null (and the first required question without one says so).
  function answered() {
    const missing = label.form.missing();
    if (missing >= 0) {
      const q = label.form.rubric.questions[missing];
      const error = $("rate-error");
      error.textContent = `Answer ${q.title} first.`;
      error.hidden = false;
      label.form.focus(missing);
      return null;
    }
    return label.form.payload();
  }

  // One save, skip or undo at a time: a key pressed while one is under way is dropped (a
  // double Enter saves once), and the work area says so (aria-busy) until it is done.
  function act(step) {
    if (label.busy || !labeling()) return;
    setBusy(true);
    serial(step).finally(() => setBusy(false));
  }

  function setBusy(on) {
    label.busy = on;
    $("label-work").setAttribute("aria-busy", String(on));
  }

  function save() {
    if (!label.current) return;
    const answers = answered();
    if (!answers) return;
    const rubric = label.form.rubric; // the version the labeler answered
    act(async () => {
      const record = label.current;
      if (!record) return;
      const reopened = label.reopened && label.reopened.trace_id === record.trace_id
        ? label.reopened : null;
      const relabel = Boolean(reopened && reopened.labeled);
      const comment = $("comment").value.trim();
      try {
        // A label of the caller's already holds its place: a new one replaces it, no claim.
        if (!relabel && !claimHeld()) {  // lapsed (or given back): claim it again before saving
          const got = await claimTrace(record.trace_id);
          if (got) {
            label.claim = got;
            showClaim();
          } else if (!(await confirmOverTarget(record))) {
            toast(`Not saved: a teammate holds ${record.trace_id} now. Here is the next trace.`);
            label.claim = null;
            label.current = null;
            label.reopened = null;
            await loadQueue();
            return;
          }
        }
        await api("labels", { method: "POST", body: {
          trace_id: record.trace_id, rubric_version: rubric.version, rubric: answers,
          ...(comment ? { comment } : {}) } });
      } catch (error) {
        if (error.status !== 401) showRateError(error);
        return;
      }
      label.done.add(record.trace_id);
      label.last = { kind: "save", record, answers, rubric, comment };
      label.claim = null;
      label.reopened = null;
      if (!reopened) label.remaining = Math.max(0, label.remaining - 1);
      if (!relabel) label.labeled += 1;
      showUndo();
      showLastEvaluator(record.trace_id);
      await next();
    });
  }

  async function next() {
    label.current = label.queue.shift() || null;
    if (!label.current) {
      await loadQueue();
      return;
    }
    showCurrent();
  }

  function showRateError(error) {
    const box = $("rate-error");
    box.textContent = error.status === 503
      ? `Not saved: ${error.message}`
      : `Could not save: ${error.message}`;
    box.hidden = false;
  }

  function skip() {
    if (!label.current) return;
    act(async () => {
      const record = label.current;
      if (!record) return;
      try {
        await api("skips", { method: "POST", body: { trace_id: record.trace_id } });
      } catch (error) {
        if (error.status !== 401) showRateError(error);
        return;
      }
      label.done.add(record.trace_id);
      label.last = { kind: "skip", record, answers: null, rubric: null };
      label.claim = null;
      label.reopened = null;
      label.remaining = Math.max(0, label.remaining - 1);
      showUndo();
      await next();
    });
  }

  // Undo the last save or skip: the label is retracted, then the trace claimed again (a fresh
  // lease) and shown as it was; the trace on the page until then is given back. When every
  // place of it is held by now, the page says so and stays on its trace.
  function undo() {
    const last = label.last;
    if (!last) return;
    act(async () => {
      const id = last.record.trace_id;
      let got;
      try {
        if (last.kind === "save") {
          await api(`labels/${encodeURIComponent(id)}`, { method: "DELETE" });
          label.labeled = Math.max(0, label.labeled - 1);
        }
        label.last = null;
        showUndo();
        label.done.delete(id);
        got = await claimTrace(id);
      } catch (error) {
        if (error.status !== 401) showRateError(error);
        return;
      }
      if (!got) {
        toast(last.kind === "save"
          ? `Label of ${id} retracted, but every place of it is held by teammates now: carry on with this trace.`
          : `Every place of ${id} is held by teammates now: carry on with this trace.`);
        await refreshCounts();
        return;
      }
      if (label.current && label.current.trace_id !== id) {
        const shown = label.current;
        label.current = null;
        if (label.claim && label.claim.trace_id === shown.trace_id) await giveBack(shown.trace_id);
      }
      label.current = last.record;
      label.claim = got;
      label.reopened = null;
      label.shown = last.rubric || label.rubric;
      label.prefill = last.answers ? { answers: last.answers, comment: last.comment } : null;
      showCurrent();
      serial(refreshCounts);  // after this undo, before the next action: keys work meanwhile
      toast(last.kind === "save"
        ? `Label of ${id} retracted: it is yours again until ${new Date(got.expires_at).toLocaleTimeString()}.`
        : `Back to ${id}: it is yours again until ${new Date(got.expires_at).toLocaleTimeString()}.`);
    });
  }

  // --- a trace by its id: from My labels (reopen a label), or the Go to form -------------------
  // The trace is shown as a queue item would be (blind; the evaluators' verdict once you
  // labeled it). Yours to change when you labeled it (a new save replaces your label, in the
  // rubric version you answered); else it is claimed like a trace of your queue.
  function openTrace(traceId) {
    if (!label.mayLabel) { toast("This token cannot label (no label scope)."); return; }
    label.started = true;
    selectTab("label", false);
    serial(async () => {
      let answer;
      try {
        answer = await api(`traces/${encodeURIComponent(traceId)}`);
      } catch (error) {
        if (error.status !== 401) toast(error.status === 404 ? `No trace ${traceId} in ${config.org}/${config.project}.` : `Could not open ${traceId}: ${error.message}`);
        return;
      }
      if (label.claim && label.claim.trace_id !== traceId) {
        const held = label.claim;
        label.claim = null;
        await giveBack(held.trace_id);
      }
      let shown = label.rubric;
      const mine = answer.my_label;
      const version = mine ? (mine.rubric_version || 0) : null;
      if (version !== null && (!label.rubric || version !== label.rubric.version)) {
        try { shown = await api(`rubric?version=${version}`); } catch (_) { /* the newest, then */ }
      }
      label.current = answer.item;
      label.reopened = { trace_id: traceId, labeled: answer.labeled };
      label.shown = shown;
      label.prefill = mine ? { answers: answersOf(mine), comment: mine.comment || "" } : null;
      if (!answer.labeled) label.claim = await claimTrace(traceId);
      showCurrent();
    });
  }

  $("goto-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("goto-input").value.trim();
    if (id) openTrace(id);
  });

  // --- the ? overlay: every key ---------------------------------------------------------------
  function openKeys() {
    const dialog = $("keys-dialog");
    if (dialog.open) return;
    dialog.showModal();
    $("keys-close").focus();
  }

  $("rate-form").addEventListener("submit", (event) => { event.preventDefault(); save(); });
  $("skip").addEventListener("click", skip);
  $("undo").addEventListener("click", undo);
  $("queue-refresh").addEventListener("click", () => { serial(loadQueue); });

  document.addEventListener("keydown", (event) => {
    if (document.querySelector("dialog[open]")) return;
    if (event.altKey || event.metaKey) return;
    const target = event.target;
    const typing = target instanceof HTMLTextAreaElement || target instanceof HTMLInputElement
      || target instanceof HTMLSelectElement;
    if (!typing && event.key === "?") {
      event.preventDefault();
      openKeys();
      return;
    }
    if (activeTab === "review") {
      reviewKey(event, typing);
      return;
    }
    if (activeTab === "compare") {
      compareTab().key(event, typing);
      return;
    }
    if (activeTab !== "label" || $("panel-label").hidden) return;
    const answering = target instanceof HTMLTextAreaElement
      && (target.id === "comment" || target.classList.contains("text-answer"));
    if (typing) {
      if (answering && event.key === "Enter" && event.ctrlKey) {
        event.preventDefault();
        save();
      } else if (answering && event.key === "Escape") {
        event.preventDefault();
        const row = target.closest(".dimension");
        if (row) row.focus();  // the highlight stays on the question: ↓ moves on
        else label.form.focus(label.form.focused);
      }
      return;
    }
    if (event.ctrlKey) return;
    if (event.key === "g" || event.key === "G") {
      event.preventDefault();
      $("goto-input").focus();
      return;
    }
    if ((event.key === "u" || event.key === "U") && label.last) {  // also from the empty queue
      event.preventDefault();
      undo();
      return;
    }
    if (!label.current || $("label-work").hidden) return;
    if (label.busy && event.key !== "Tab") {  // a save or skip under way: the form is leaving
      event.preventDefault();
      return;
    }
    const onTab = target.getAttribute && target.getAttribute("role") === "tab";
    if (label.form.key(event)) {  // from the tab list too: its keys are the arrows
      event.preventDefault();
    } else if (event.key === "ArrowDown" || event.key === "ArrowRight") {
      if (onTab) return;
      event.preventDefault();
      label.form.move(1);
    } else if (event.key === "ArrowUp" || event.key === "ArrowLeft") {
      if (onTab) return;
      event.preventDefault();
      label.form.move(-1);
    } else if (event.key === "Enter") {
      const isScale = target.closest && target.closest(".scale");
      if (target instanceof HTMLButtonElement && !isScale) return; // the button's own action
      event.preventDefault();
      save();
    } else if (event.key === "s" || event.key === "S") {
      event.preventDefault();
      skip();
    } else if (!["Shift", "Tab"].includes(event.key)) {
      label.form.moved = false;
    }
  });


  // =====================================================================================
  // My labels tab: the caller's labels, newest first, searched; Open shows one to change
  // =====================================================================================
  const mine = { cursor: null, q: "", seq: 0 };

  function when(stamp) {
    if (!stamp) return "–";
    const at = new Date(stamp);
    return Number.isNaN(at.getTime()) ? stamp : at.toLocaleString();
  }

  async function loadMyLabels(more) {
    if (!token) return;
    const seq = ++mine.seq;
    const params = new URLSearchParams({ limit: "20" });
    if (mine.q) params.set("q", mine.q);
    if (more && mine.cursor) params.set("cursor", mine.cursor);
    const error = $("mylabels-error");
    let page;
    try {
      page = await api(`mylabels?${params}`);
    } catch (failure) {
      if (seq !== mine.seq || failure.status === 401) return;
      error.textContent = failure.status === 403
        ? "This token cannot label (no label scope): it has no labels of its own."
        : `Could not list your labels: ${failure.message}`;
      error.hidden = false;
      return;
    }
    if (seq !== mine.seq) return;
    error.hidden = true;
    const body = $("mylabels-table").querySelector("tbody");
    if (!more) body.replaceChildren();
    for (const item of page.items) {
      const open = h("button", { type: "button", class: "link", "aria-label": `Open ${item.trace_id}` }, "Open");
      open.addEventListener("click", () => openTrace(item.trace_id));
      body.append(h("tr", { "data-trace": item.trace_id },
        h("td", {}, h("span", { class: "tag" }, item.trace_id),
          item.kind === "adjudication" ? h("span", { class: "badge warn" }, " decision") : null),
        h("td", {}, item.scenario), h("td", {}, when(item.occurred_at)),
        h("td", {}, item.reward === null ? "–" : Number(item.reward).toFixed(2)),
        h("td", { class: "comment-cell" }, item.comment || ""),
        h("td", {}, item.kind === "label" ? open : "")));
    }
    mine.cursor = page.next_cursor;
    $("mylabels-more").hidden = !page.next_cursor;
    $("mylabels-empty").hidden = body.children.length > 0;
  }

  $("mylabels-form").addEventListener("submit", (event) => {
    event.preventDefault();
    mine.q = $("mylabels-q").value.trim();
    mine.cursor = null;
    loadMyLabels(false);
  });
  $("mylabels-more").addEventListener("click", () => loadMyLabels(true));

  // =====================================================================================
  // Review tab (scope review): a disputed trace, every label side by side, a decision
  // =====================================================================================
  const review = { current: null, claim: null, minSpread: null, busy: false, started: false };
  review.form = new QuestionForm($("decide-questions"), {
    prefix: "decide",
    onChange: () => {
      $("decide-error").hidden = true;
      const value = review.form.reward();
      $("decide-reward").textContent = value === null || review.form.missing() >= 0 ? "–" : value.toFixed(2);
    },
  });
  review.form.active = () => activeTab === "review" && Boolean(review.current);

  function reviewPanel(which) {
    $("review-start").hidden = which !== "start";
    $("review-empty").hidden = which !== "empty";
    $("review-work").hidden = which !== "work";
  }

  function enterReview() {
    if (!review.started) {
      reviewPanel("start");
      countReview();
      return;
    }
    if (!review.current) serial(claimReview);
  }

  async function countReview() {
    const params = new URLSearchParams({ limit: "1" });
    if (review.minSpread !== null) params.set("min_spread", String(review.minSpread));
    try {
      const body = await api(`review/queue?${params}`);
      $("review-count").textContent = `${body.remaining} disputed trace${body.remaining === 1 ? "" : "s"} to decide`;
    } catch (error) {
      if (error.status !== 401) $("review-count").textContent = error.status === 403 ? "This token has no review scope" : "";
    }
  }

  async function claimReview() {
    if (activeTab !== "review") return;
    let body;
    try {
      body = await api("review/claim", { method: "POST", body: {
        limit: 1, ...(review.minSpread !== null ? { min_spread: review.minSpread } : {}) } });
    } catch (error) {
      if (error.status !== 401) toast(`Could not claim a disputed trace: ${error.message}`);
      return;
    }
    $("review-count").textContent = `${body.remaining} disputed trace${body.remaining === 1 ? "" : "s"} to decide`;
    review.current = body.items[0] || null;
    review.claim = body.claims[0] || null;
    showReview();
  }

  async function releaseReview() {
    const claim = review.claim;
    review.claim = null;
    review.current = null;
    if (!claim || !token) return;
    try {
      await api(`review/claims/${encodeURIComponent(claim.trace_id)}`, { method: "DELETE" });
    } catch (_) { /* ended already */ }
  }

  // The labels side by side: a row per labeler, a column per question of their version.
  function labelsTable(record) {
    const entries = (record.human_labels || []).filter((e) => (e.kind || "label") === "label");
    const questions = [];
    for (const q of (label.rubric || window.RLXForms.VERSION_0).questions) questions.push(q);
    for (const entry of entries) {
      for (const name of Object.keys(answersOf(entry) || {})) {
        if (!questions.some((q) => q.name === name)) questions.push({ name, title: name, kind: "" });
      }
    }
    const head = $("review-labels").querySelector("thead");
    head.replaceChildren(h("tr", {}, h("th", { scope: "col" }, "Labeler"),
      ...questions.map((q) => h("th", { scope: "col" }, q.title)),
      h("th", { scope: "col" }, "Reward"), h("th", { scope: "col" }, "Comment")));
    const body = $("review-labels").querySelector("tbody");
    body.replaceChildren(...entries.map((entry) => {
      const answers = answersOf(entry) || {};
      const version = entry.rubric_version || 0;
      const reward = entry.reward !== undefined && entry.reward !== null ? entry.reward
        : version === 0 ? rewardOf(window.RLXForms.VERSION_0, answers) : null;
      return h("tr", {}, h("th", { scope: "row" }, entry.labeler,
        version !== (label.rubric ? label.rubric.version : 0) ? h("span", { class: "muted" }, ` (v${version})`) : null),
      ...questions.map((q) => h("td", {}, answerText(q, answers[q.name]))),
      h("td", {}, reward === null ? "–" : Number(reward).toFixed(2)),
      h("td", { class: "comment-cell" }, entry.comment || ""));
    }));
  }

  function showReview() {
    const record = review.current;
    if (!record) {
      reviewPanel("empty");
      return;
    }
    reviewPanel("work");
    $("review-meta").replaceChildren(
      h("span", { class: "tag", title: "trace id" }, record.trace_id),
      h("span", { class: "tag" }, record.scenario), h("span", { class: "tag" }, record.agent_version));
    renderMessages(record.messages, $("review-messages"));
    labelsTable(record);
    review.form.render(label.rubric, {});
    $("decide-comment").value = "";
    $("decide-error").hidden = true;
    $("decide-reward").textContent = "–";
    review.form.focus(0);
  }

  function decide() {
    const record = review.current;
    if (!record || review.busy) return;
    const missing = review.form.missing();
    if (missing >= 0) {
      $("decide-error").textContent = `Answer ${review.form.rubric.questions[missing].title} first.`;
      $("decide-error").hidden = false;
      review.form.focus(missing);
      return;
    }
    review.busy = true;
    serial(async () => {
      const comment = $("decide-comment").value.trim();
      try {
        await api("labels", { method: "POST", body: {
          trace_id: record.trace_id, kind: "adjudication", rubric_version: review.form.rubric.version,
          rubric: review.form.payload(), ...(comment ? { comment } : {}) } });
      } catch (error) {
        if (error.status !== 401) {
          $("decide-error").textContent = `Not saved: ${error.message}`;
          $("decide-error").hidden = false;
        }
        return;
      }
      toast(`Decision on ${record.trace_id} saved: it is the trace's human reward now.`);
      review.claim = null;
      review.current = null;
      await claimReview();
    }).finally(() => { review.busy = false; });
  }

  function reviewKey(event, typing) {
    if (!review.current || $("review-work").hidden || event.altKey || event.metaKey) return;
    const target = event.target;
    if (typing) {
      if (target instanceof HTMLTextAreaElement && event.key === "Enter" && event.ctrlKey) {
        event.preventDefault();
        decide();
      } else if (target.classList && target.classList.contains("text-answer") && event.key === "Escape") {
        event.preventDefault();
        const row = target.closest(".dimension");
        if (row) row.focus();
      }
      return;
    }
    if (event.ctrlKey) return;
    const onTab = target.getAttribute && target.getAttribute("role") === "tab";
    if (onTab) return;
    if (review.form.key(event)) {
      event.preventDefault();
    } else if (event.key === "ArrowDown" || event.key === "ArrowRight") {
      event.preventDefault();
      review.form.move(1);
    } else if (event.key === "ArrowUp" || event.key === "ArrowLeft") {
      event.preventDefault();
      review.form.move(-1);
    } else if (event.key === "Enter") {
      const isScale = target.closest && target.closest(".scale");
      if (target instanceof HTMLButtonElement && !isScale) return;
      event.preventDefault();
      decide();
    } else if (!["Shift", "Tab"].includes(event.key)) {
      review.form.moved = false;
    }
  }

  $("decide-form").addEventListener("submit", (event) => { event.preventDefault(); decide(); });
  $("review-start-button").addEventListener("click", () => {
    review.started = true;
    serial(claimReview);
  });
  $("review-refresh").addEventListener("click", () => serial(claimReview));
  $("review-release").addEventListener("click", () => {
    serial(async () => {
      await releaseReview();
      reviewPanel("start");
      review.started = false;
      await countReview();
    });
  });
  $("review-scope").addEventListener("submit", (event) => {
    event.preventDefault();
    const raw = $("review-spread").value.trim();
    review.minSpread = raw === "" ? null : Number(raw);
    serial(async () => {
      await releaseReview();
      if (review.started) await claimReview();
      else await countReview();
    });
  });

  // =====================================================================================
  // Rubric tab: the project's questions and guidelines; an admin edits them, with a preview
  // =====================================================================================
  const KINDS = [["rating", "Rating"], ["choice", "Choice"], ["boolean", "Yes / no"], ["text", "Text"]];
  const rubricDraft = { rubric: null, version: null, timer: null };
  const preview = new QuestionForm($("rubric-preview-questions"), {
    prefix: "preview",
    onChange: () => {
      const value = preview.reward();
      $("rubric-preview-reward").textContent = value === null ? "–" : value.toFixed(2);
    },
  });
  preview.active = () => false; // clicking answers; the preview never takes the focus

  function editable() { return Boolean(label.me && (label.me.scopes || []).includes("admin")); }

  function copyRubric(rubric) {
    return { guidelines: rubric.guidelines || "", questions: JSON.parse(JSON.stringify(rubric.questions)) };
  }

  async function showRubricTab() {
    await loadRubric();
    const rubric = label.rubric || window.RLXForms.VERSION_0;
    $("rubric-version").textContent = `(version ${rubric.version}${rubric.version === 0 ? ": the default" : ""})`;
    $("rubric-form").hidden = !editable();
    $("rubric-note").textContent = editable()
      ? "What labelers answer for each trace. Saving makes a new version; labels keep the version they were made with."
      : "What labelers answer for each trace. An admin of this project changes it.";
    // The draft is kept while it edits the newest version: coming back to the tab (or a
    // second look at the rubric) never throws away what the admin typed.
    if (rubricDraft.version !== rubric.version) {
      rubricDraft.rubric = copyRubric(rubric);
      rubricDraft.version = rubric.version;
      $("rubric-guidelines").value = rubricDraft.rubric.guidelines;
      renderEditor();
      showPreview(rubric.guidelines_html || "");
    }
  }

  function field(labelText, input) {
    return h("label", { class: "field" }, labelText, input);
  }

  function input(attrs, value, onInput) {
    const el = h("input", attrs);
    el.value = value === undefined || value === null ? "" : String(value);
    el.addEventListener("input", () => { onInput(el.value); schedulePreview(); });
    return el;
  }

  function renderEditor() {
    const list = $("rubric-questions");
    list.replaceChildren();
    rubricDraft.rubric.questions.forEach((q, index) => list.append(questionEditor(q, index)));
  }

  function questionEditor(q, index) {
    const n = index + 1;
    const kind = h("select", { "aria-label": `question ${n} kind` },
      ...KINDS.map(([value, text]) => h("option", { value }, text)));
    kind.value = q.kind;
    kind.addEventListener("change", () => {
      const fresh = { name: q.name, title: q.title, description: q.description || "", kind: kind.value,
        required: kind.value !== "text", weight: q.weight === undefined ? 1 : q.weight };
      if (kind.value === "rating") Object.assign(fresh, { min: 1, max: 5, levels: {} });
      if (kind.value === "choice") fresh.options = [{ value: "yes", title: "Yes", description: "", reward: 1 }, { value: "no", title: "No", description: "", reward: 0 }];
      rubricDraft.rubric.questions[index] = fresh;
      renderEditor();
      schedulePreview();
    });
    const required = h("input", { type: "checkbox", "aria-label": `question ${n} required` });
    required.checked = Boolean(q.required);
    required.addEventListener("change", () => { q.required = required.checked; schedulePreview(); });
    const parts = [
      h("div", { class: "field-row" },
        field(`Name`, input({ "aria-label": `question ${n} name`, pattern: "[a-z][a-z0-9_]{0,31}", maxlength: "32", required: true }, q.name, (v) => { q.name = v; })),
        field(`Title`, input({ "aria-label": `question ${n} title`, maxlength: "200", required: true }, q.title, (v) => { q.title = v; })),
        field("Kind", kind),
        h("label", { class: "field check" }, required, "Required"),
        q.kind === "text" ? null : field("Weight", input({ type: "number", min: "0", step: "0.5", "aria-label": `question ${n} weight` }, q.weight, (v) => { q.weight = v === "" ? 1 : Number(v); }))),
      field("Description", input({ "aria-label": `question ${n} description`, maxlength: "2000" }, q.description, (v) => { q.description = v; })),
    ];
    if (q.kind === "rating") parts.push(ratingEditor(q, n));
    if (q.kind === "choice") parts.push(choiceEditor(q, n));
    const up = h("button", { type: "button", "aria-label": `move question ${n} up` }, "↑");
    const down = h("button", { type: "button", "aria-label": `move question ${n} down` }, "↓");
    const remove = h("button", { type: "button", class: "link", "aria-label": `remove question ${n}` }, "Remove");
    up.disabled = index === 0;
    down.disabled = index === rubricDraft.rubric.questions.length - 1;
    const shift = (delta) => {
      const [item] = rubricDraft.rubric.questions.splice(index, 1);
      rubricDraft.rubric.questions.splice(index + delta, 0, item);
      renderEditor();
      schedulePreview();
    };
    up.addEventListener("click", () => shift(-1));
    down.addEventListener("click", () => shift(1));
    remove.addEventListener("click", () => {
      rubricDraft.rubric.questions.splice(index, 1);
      renderEditor();
      schedulePreview();
    });
    return h("li", { class: "question-editor" }, h("div", { class: "question-head" },
      h("strong", {}, `Question ${n}`), h("span", {}, up, down, remove)), ...parts);
  }

  function ratingEditor(q, n) {
    const rerender = () => { renderEditor(); schedulePreview(); };
    const min = input({ type: "number", min: "0", max: "100", step: "1", "aria-label": `question ${n} lowest value` }, q.min, (v) => { q.min = Number(v); });
    const max = input({ type: "number", min: "1", max: "100", step: "1", "aria-label": `question ${n} highest value` }, q.max, (v) => { q.max = Number(v); });
    min.addEventListener("change", rerender);
    max.addEventListener("change", rerender);
    const levels = h("div", { class: "levels" });
    q.levels = q.levels || {};
    for (let v = q.min; v <= q.max && v - q.min < 11; v += 1) {
      const level = q.levels[String(v)] || (q.levels[String(v)] = { title: "", description: "" });
      levels.append(h("div", { class: "field-row" }, h("span", { class: "level-value" }, String(v)),
        input({ "aria-label": `question ${n} level ${v} title`, maxlength: "200", placeholder: "title" }, level.title, (t) => { level.title = t; }),
        input({ "aria-label": `question ${n} level ${v} description`, maxlength: "2000", placeholder: "what this value means", class: "grow" }, level.description, (t) => { level.description = t; })));
    }
    return h("div", { class: "kind-fields" }, h("div", { class: "field-row" }, field("From", min), field("to", max)), levels);
  }

  function choiceEditor(q, n) {
    const box = h("div", { class: "kind-fields" });
    q.options.forEach((option, k) => {
      const remove = h("button", { type: "button", class: "link", "aria-label": `remove option ${k + 1} of question ${n}` }, "Remove");
      remove.addEventListener("click", () => { q.options.splice(k, 1); renderEditor(); schedulePreview(); });
      box.append(h("div", { class: "field-row" },
        input({ "aria-label": `question ${n} option ${k + 1} value`, maxlength: "64", placeholder: "value" }, option.value, (v) => { option.value = v; }),
        input({ "aria-label": `question ${n} option ${k + 1} title`, maxlength: "200", placeholder: "title" }, option.title, (v) => { option.title = v; }),
        input({ type: "number", min: "0", max: "1", step: "0.05", "aria-label": `question ${n} option ${k + 1} reward`, placeholder: "reward" }, option.reward, (v) => { option.reward = v === "" ? null : Number(v); }),
        input({ "aria-label": `question ${n} option ${k + 1} description`, maxlength: "2000", placeholder: "what it means", class: "grow" }, option.description, (v) => { option.description = v; }),
        remove));
    });
    const add = h("button", { type: "button" }, "Add an option");
    add.addEventListener("click", () => {
      q.options.push({ value: `option_${q.options.length + 1}`, title: `Option ${q.options.length + 1}`, description: "", reward: null });
      renderEditor();
      schedulePreview();
    });
    box.append(add);
    return box;
  }

  // The rubricDraft as PUT rubric takes it (empty levels and descriptions left out).
  function draftBody() {
    const questions = rubricDraft.rubric.questions.map((q) => {
      const out = { name: q.name, title: q.title, description: q.description || "", kind: q.kind,
        required: Boolean(q.required), weight: q.weight === undefined ? 1 : Number(q.weight) };
      if (q.kind === "rating") {
        out.min = Number(q.min);
        out.max = Number(q.max);
        out.levels = {};
        for (const [value, level] of Object.entries(q.levels || {})) {
          const v = Number(value);
          if (v >= out.min && v <= out.max && (level.title || level.description)) out.levels[value] = level;
        }
      }
      if (q.kind === "choice") out.options = q.options.map((o) => ({ ...o }));
      return out;
    });
    return { guidelines: $("rubric-guidelines").value, questions };
  }

  function showPreview(html) {
    $("rubric-preview-guidelines").innerHTML = html || ""; // the service's safe HTML (top of file)
    const body = draftBody();
    preview.render({ version: -1, questions: body.questions.filter((q) => q.name && q.title) }, {});
    $("rubric-preview-reward").textContent = "–";
  }

  function schedulePreview() {
    clearTimeout(rubricDraft.timer);
    rubricDraft.timer = setTimeout(refreshPreview, 300);
  }

  // POST rubric/preview: the guidelines rendered as labelers will see them, and what (if
  // anything) keeps the rubricDraft from being saved.
  async function refreshPreview() {
    if (!editable()) return;
    const error = $("rubric-error");
    try {
      const answer = await api("rubric/preview", { method: "POST", body: draftBody() });
      showPreview(answer.guidelines_html);
      error.hidden = !answer.problem;
      error.textContent = answer.problem ? `Not saved yet: ${answer.problem}` : "";
    } catch (failure) {
      if (failure.status === 401) return;
      error.textContent = failure.message;
      error.hidden = false;
    }
  }

  $("rubric-guidelines").addEventListener("input", schedulePreview);
  $("rubric-preview-button").addEventListener("click", refreshPreview);
  $("rubric-add").addEventListener("click", () => {
    const n = rubricDraft.rubric.questions.length + 1;
    rubricDraft.rubric.questions.push({ name: `question_${n}`, title: `Question ${n}`, description: "", kind: "rating",
      required: true, weight: 1, min: 1, max: 5, levels: {} });
    renderEditor();
    schedulePreview();
    const items = $("rubric-questions").querySelectorAll("li");
    const last = items[items.length - 1];
    if (last) last.querySelector("input").focus();
  });
  $("rubric-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = $("rubric-error");
    try {
      const saved = await api("rubric", { method: "PUT", body: draftBody() });
      error.hidden = true;
      toast(saved.created ? `Rubric version ${saved.version} saved: new traces are labeled with it.`
        : `Nothing changed: version ${saved.version} is the same.`);
      label.rubric = null;
      rubricDraft.version = null;  // a new version: the draft starts from it
      await showRubricTab();
    } catch (failure) {
      if (failure.status === 401) return;
      error.textContent = `Not saved: ${failure.message}`;
      error.hidden = false;
    }
  });

  // =====================================================================================
  // Export tab
  // =====================================================================================
  const SOURCES = [["human", "Human labels"], ["evaluator", "Evaluator score"]];
  const JSONL = [
    ["trajectory", "Trajectory"], ["prompt_completion", "Prompt/completion"],
    ["messages", "Messages"], ["kto", "KTO"], ["preference", "Preference"],
    ["executions", "Executions"], ["rl_prompts", "RL prompts"],
  ];
  const TABULAR = [["csv", "CSV"], ["json", "JSON"], ["parquet", "Parquet"], ["zip", "ZIP"]];
  const EXTENSIONS = { csv: ".csv", json: ".json", parquet: ".parquet", zip: ".zip" };
  const exp = {
    source: "human", format: "trajectory", columns: null, stats: null, shown: null, seq: 0,
    version: "", // a pinned version of the source corpus ("": the latest, live)
  };

  function segmented(box, groups, current, onPick) {
    box.replaceChildren();
    const buttons = [];
    for (const [title, items] of groups) {
      const group = h("span", { class: "segmented" });
      if (title) group.append(h("span", { class: "group-label" }, title));
      box.append(group);
      for (const [value, name] of items) {
        const button = h("button", {
          type: "button", role: "radio", "aria-checked": String(value === current),
          "data-value": value, tabindex: value === current ? "0" : "-1",
        }, name);
        button.addEventListener("click", () => pick(value));
        buttons.push(button);
        group.append(button);
      }
    }
    function pick(value, focus) {
      for (const b of buttons) {
        const on = b.dataset.value === value;
        b.setAttribute("aria-checked", String(on));
        b.tabIndex = on ? 0 : -1;
        if (on && focus) b.focus();
      }
      onPick(value);
    }
    box.addEventListener("keydown", (event) => {
      const index = buttons.findIndex((b) => b.getAttribute("aria-checked") === "true");
      if (event.key === "ArrowRight" || event.key === "ArrowDown") {
        event.preventDefault();
        pick(buttons[(index + 1) % buttons.length].dataset.value, true);
      } else if (event.key === "ArrowLeft" || event.key === "ArrowUp") {
        event.preventDefault();
        pick(buttons[(index - 1 + buttons.length) % buttons.length].dataset.value, true);
      }
    });
  }

  segmented($("source"), [["", SOURCES]], exp.source, (value) => {
    exp.source = value;
    exp.version = ""; // versions are a corpus's own
    loadVersions();
    refreshExport();
  });

  // --- pinned versions of the source corpus (GET versions; admins pin with POST) --------
  async function loadVersions() {
    const select = $("version");
    const source = exp.source;
    let versions = [];
    try {
      versions = (await api(`versions?${new URLSearchParams({ corpus: source })}`)).items;
    } catch (err) {
      if (err.status !== 401 && err.status !== 403) toast(`Could not list versions: ${err.message}`);
    }
    if (source !== exp.source) return; // the source changed meanwhile
    if (!versions.some((v) => v.name === exp.version)) exp.version = "";
    select.replaceChildren(h("option", { value: "" }, "Latest (live)"), ...versions.map((v) =>
      h("option", { value: v.name, title: v.note || null },
        `${v.name} · ${new Date(v.created_at).toLocaleString()}`)));
    select.value = exp.version;
    showVersionNote(versions);
  }

  function showVersionNote(versions) {
    const picked = versions && versions.find((v) => v.name === exp.version);
    $("version-note").textContent = !exp.version ? "Refreshed as traffic comes"
      : `As pinned${picked && picked.note ? `: ${picked.note}` : ""}; traces deleted since are left out`;
  }

  $("version").addEventListener("change", () => {
    exp.version = $("version").value;
    showVersionNote(null);
    loadVersions();
    refreshExport();
  });

  $("version-pin").addEventListener("click", () => {
    $("pin-error").hidden = true;
    $("pin-name").value = "";
    $("pin-note").value = "";
    $("pin-dialog").showModal();
  });

  // Enter in the dialog pins (Pin is its form's only submit button); Cancel and Esc close it.
  $("pin-cancel").addEventListener("click", () => $("pin-dialog").close());
  $("pin-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = $("pin-name").value.trim();
    try {
      await api("versions", { method: "POST", body: { corpus: exp.source, name, note: $("pin-note").value } });
    } catch (err) {
      if (err.status === 401) return;
      $("pin-error").textContent = err.message;
      $("pin-error").hidden = false;
      return;
    }
    $("pin-dialog").close();
    exp.version = name;
    await loadVersions();
    refreshExport();
    toast(`Pinned ${exp.source} as ${name}`);
  });
  segmented($("format"), [["JSON Lines", JSONL], ["Tabular", TABULAR]], exp.format, (value) => {
    exp.format = value;
    $("columns-open").hidden = !isTabular();
    refreshExport();
  });

  function isTabular() { return TABULAR.some(([value]) => value === exp.format); }

  // The Redact control: one box per kind, the service's default (secrets) checked at first.
  const KIND_NAMES = {
    secrets: ["Secrets", "secret", "secrets"], email: ["E-mail", "e-mail address", "e-mail addresses"],
    phone: ["Phone", "phone number", "phone numbers"],
    credit_card: ["Credit card", "card number", "card numbers"],
    iban: ["IBAN", "IBAN", "IBANs"], ip: ["IP address", "IP address", "IP addresses"],
  };
  for (const kind of config.redact_kinds) {
    const box = h("input", { type: "checkbox", name: "redact", value: kind });
    box.checked = config.redact.includes(kind);
    box.addEventListener("change", refreshExport);
    $("redact-kinds").append(h("label", {}, box, (KIND_NAMES[kind] || [kind])[0]));
  }

  // Without the raw scope the service refuses less redaction than its default (403
  // raw_required): the default kinds are checked again and locked, and the tab asks again.
  document.addEventListener("rl-raw-required", () => {
    for (const box of $("redact-kinds").querySelectorAll("input")) {
      if (config.redact.includes(box.value)) {
        box.checked = true;
        box.disabled = true;
      }
    }
    $("redact").title = "This token has no raw scope: the default redaction stays on.";
    refreshExport();
  });

  function redactValue() {
    const kinds = [...$("redact-kinds").querySelectorAll("input:checked")].map((b) => b.value);
    return kinds.length ? kinds.join(",") : "none";
  }

  function showRedactions(response) {
    const line = $("redactions");
    const header = response.headers.get("X-RL-Export-Redactions");
    const counts = header ? JSON.parse(header) : {};
    const removed = Object.entries(counts).filter(([, n]) => n > 0)
      .map(([kind, n]) => `${n} ${(KIND_NAMES[kind] || [kind, kind, kind])[n === 1 ? 1 : 2]}`);
    line.className = removed.length ? "redactions removed" : "redactions";
    line.dataset.counts = JSON.stringify(counts);
    if (!Object.keys(counts).length) line.textContent = "Nothing redacted: the preview is verbatim.";
    else if (!removed.length) line.textContent = "Redacted from this preview: nothing found.";
    else line.textContent = `Redacted from this preview: ${removed.join(", ")}.`;
  }

  function filterValues() {
    const values = {};
    for (const field of $("filters").querySelectorAll("input, select")) {
      const raw = field.value.trim();
      if (!raw) continue;
      if (field.name === "pass_dimension") {
        values.pass_dimension = raw.split(",").map((s) => s.trim()).filter(Boolean);
      } else if (field.type === "datetime-local") {
        const when = new Date(raw);
        if (!Number.isNaN(when.getTime())) values[field.name] = when.toISOString();
      } else {
        values[field.name] = raw;
      }
    }
    return values;
  }

  function columnsText() {
    if (!isTabular() || !exp.columns) return null;
    return exp.columns.map((c) => (c.header && c.header !== c.path ? `${c.path}:${c.header}` : c.path)).join(",");
  }

  // The Training set box: splits and deduplication, for the preview and the downloads.
  function trainingValues() {
    const values = {};
    for (const field of $("training").querySelectorAll("input, select")) {
      const raw = field.value.trim();
      if (raw) values[field.name] = raw;
    }
    return values;
  }

  function query(extra, { redact = true, training = true } = {}) {
    const params = new URLSearchParams({ source: exp.source, ...extra });
    if (redact) params.set("redact", redactValue());
    if (exp.version) params.set("version", exp.version);
    if (training) for (const [key, value] of Object.entries(trainingValues())) params.set(key, value);
    for (const [key, value] of Object.entries(filterValues())) {
      if (Array.isArray(value)) value.forEach((v) => params.append(key, v));
      else params.set(key, value);
    }
    return params;
  }

  // The Training set box: before any download, how the matching rows fall into the splits
  // (GET splits), and what to warn about (an empty split, a split-by with few values).
  const training = { key: null, counts: null, seq: 0 };

  async function loadSplitCounts() {
    const values = trainingValues();
    const line = $("training-counts");
    const list = $("training-warnings");
    if (!values.splits) {
      training.key = null;
      training.counts = null;
      line.textContent = "";
      list.replaceChildren();
      return;
    }
    const params = query({ splits: values.splits }, { redact: false, training: false });
    if (values.split_by) params.set("split_by", values.split_by);
    if (values.split_salt) params.set("split_salt", values.split_salt);
    const key = params.toString();
    if (key === training.key) return;
    const seq = ++training.seq;
    try {
      const counts = await api(`splits?${params}`);
      if (seq !== training.seq) return;
      training.key = key;
      training.counts = counts;
      line.textContent = Object.entries(counts.rows)
        .map(([name, n]) => `${name}: ${n.toLocaleString()} row${n === 1 ? "" : "s"}`).join(" · ")
        + ` (by ${counts.split_by}: ${counts.values.toLocaleString()} distinct value${counts.values === 1 ? "" : "s"})`;
      list.replaceChildren(...counts.warnings.map((w) => h("li", { class: "warning" }, w)));
    } catch (error) {
      if (seq !== training.seq || error.status === 401) return;
      training.key = null;
      training.counts = null;
      line.textContent = "";
      list.replaceChildren(h("li", { class: "warning" }, error.message));
    }
  }

  function summaryOfFilters() {
    const count = Object.keys(filterValues()).length;
    $("filters-summary").textContent = count ? `(${count} set)` : "";
    const training = trainingValues();
    $("training-summary").textContent = [
      training.split ? `split ${training.split}` : "", training.dedup ? `${training.dedup} dedup` : "",
    ].filter(Boolean).join(", ");
  }

  let refreshTimer = null;
  function refreshExport() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(loadExport, 200);
  }

  // The corpora grow while the tab is open: while it is shown (and the page is visible) its
  // numbers are asked for again every FOLLOW_MS, and the preview with them when they changed.
  const FOLLOW_MS = 5000;
  let followTimer = null;
  function followExport() {
    clearTimeout(followTimer);
    if (!token || activeTab !== "export" || document.hidden) return;
    followTimer = setTimeout(() => loadExport({ follow: true }).finally(followExport), FOLLOW_MS);
  }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && activeTab === "export") refreshExport();
    followExport();
  });

  async function loadExport({ follow = false } = {}) {
    if (!token || activeTab !== "export") return;
    if (!follow) followExport(); // the next look is FOLLOW_MS after this one
    summaryOfFilters();
    if (!follow) loadSplitCounts();
    const seq = ++exp.seq;
    const error = $("export-error");
    const previewParams = query({ format: exp.format });
    const columns = columnsText();
    if (columns) previewParams.set("columns", columns);
    const limit = Number(previewParams.get("limit") || 0);
    previewParams.set("limit", String(limit && limit < 5 ? limit : 5));
    const statsParams = query({}, { redact: false, training: false });
    const shown = `${statsParams} ${previewParams}`; // what the tab shows once this succeeds
    const askPreview = () => api(`records?${previewParams}`, { raw: true });
    try {
      const statsAsked = api(`stats?${statsParams}`);
      const previewAsked = follow ? null : askPreview();
      previewAsked?.catch(() => {}); // awaited below; not an unhandled rejection meanwhile
      const stats = await statsAsked;
      if (seq !== exp.seq) return; // a newer request is on its way
      const now = new Date().toLocaleTimeString([], { hour12: false });
      $("stats-asof").textContent = `As of ${now}, asked again every ${FOLLOW_MS / 1000} s`;
      // A follow-up that finds the same numbers for what is shown changes nothing. (It may
      // have overtaken a change of format: then it is not what is shown. An error shown stays
      // until the whole of a later look succeeds.)
      if (follow && error.hidden && shown === exp.shown
          && JSON.stringify(stats) === JSON.stringify(exp.stats)) return;
      const answer = await (previewAsked || askPreview());
      const preview = await answer.json();
      if (seq !== exp.seq) return;
      error.hidden = true;
      exp.stats = stats;
      exp.shown = shown;
      renderStats(stats);
      renderPreview(preview, stats);
      showRedactions(answer);
    } catch (err) {
      if (seq !== exp.seq || err.status === 401) return;
      error.textContent = err.status === 403
        ? "This token cannot export (it has no export scope)."
        : err.message;
      error.hidden = false;
    }
  }

  function renderStats(stats) {
    $("stat-records").textContent = stats.records.toLocaleString();
    $("stat-avg").textContent = stats.avg_reward === null ? "–" : stats.avg_reward.toFixed(3);
    $("stat-pass").textContent = stats.pass_rate === null ? "–" : `${(stats.pass_rate * 100).toFixed(1)}%`;
    $("stat-labeled").textContent = stats.human_labeled.toLocaleString();
    const box = $("histogram");
    box.replaceChildren();
    const max = Math.max(1, ...stats.reward_histogram.map((b) => b.count));
    const described = [];
    for (const bin of stats.reward_histogram) {
      described.push(`${bin.lo.toFixed(1)}–${bin.hi.toFixed(1)}: ${bin.count}`);
      // The bar's height through the CSSOM: the Content-Security-Policy refuses style attributes.
      const fill = h("div", { class: "fill" });
      fill.style.height = `${(bin.count / max) * 80}%`;
      box.append(h("div", { class: "hbar", title: `reward ${bin.lo.toFixed(1)}–${bin.hi.toFixed(1)}: ${bin.count}` },
        h("span", { class: "count" }, bin.count ? String(bin.count) : ""),
        fill,
        h("span", { class: "lo" }, bin.lo.toFixed(1))));
    }
    box.setAttribute("aria-label", `Reward histogram: ${described.join(", ")}`);
  }

  function cell(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function renderPreview(preview, stats) {
    const box = $("preview");
    box.replaceChildren();
    const shown = preview.items.length;
    const kept = trainingValues().split;
    const splitRows = kept && training.counts ? training.counts.rows[kept] : undefined;
    const unit = exp.format === "preference" ? "pairs from" : "of";
    $("preview-note").textContent = stats.index && !stats.index.ready
      ? "(indexing…)"
      : splitRows !== undefined
        ? `(first ${shown} of ${splitRows.toLocaleString()} rows of split ${kept})`
        : `(first ${shown} ${unit} ${stats.records.toLocaleString()} records)`;
    if (!shown) {
      box.append(h("p", { class: "muted" }, "Nothing matches: no record of this source passes the filters (yet)."));
      return;
    }
    if (preview.columns) {
      const table = h("table", {},
        h("thead", {}, h("tr", {}, preview.columns.map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, preview.items.map((row) => h("tr", {},
          preview.columns.map((c) => h("td", { title: cell(row[c]).slice(0, 2000) }, cell(row[c])))))));
      box.append(table);
      return;
    }
    for (const item of preview.items) box.append(h("pre", {}, JSON.stringify(item, null, 2)));
  }

  $("filters").addEventListener("input", refreshExport);
  $("filters").addEventListener("change", refreshExport);
  $("training").addEventListener("input", refreshExport);
  $("training").addEventListener("change", refreshExport);
  $("filters-clear").addEventListener("click", () => {
    for (const field of $("filters").querySelectorAll("input, select")) field.value = "";
    refreshExport();
  });

  // --- downloads ---------------------------------------------------------------------------
  function fileName(response) {
    const header = response.headers.get("Content-Disposition") || "";
    const match = /filename="([^"]+)"/.exec(header);
    if (match) return match[1];
    const ext = EXTENSIONS[exp.format] || ".jsonl";
    return `${config.org}-${config.project}-${exp.source}-${exp.format}${ext}`;
  }

  async function saveResponse(response) {
    const blob = await response.blob();
    const url = URL.createObjectURL(blob);
    const link = h("a", { href: url, download: fileName(response) });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 30000);
  }

  async function download() {
    const button = $("download");
    const records = exp.stats ? exp.stats.records : Infinity;
    const filters = filterValues();
    const limit = filters.limit ? Number(filters.limit) : Infinity;
    if (Math.min(records, limit) > config.sync_export_max_records) {
      await startJob(filters);
      return;
    }
    button.disabled = true;
    try {
      const params = query({ format: exp.format });
      const columns = columnsText();
      if (columns) params.set("columns", columns);
      await saveResponse(await api(`export?${params}`, { raw: true }));
    } catch (err) {
      if (err.status !== 401) toast(`Download failed: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  }
  $("download").addEventListener("click", download);
  // A background export of any size (the page starts one by itself past
  // sync_export_max_records): keep working, download when it is ready.
  $("download-job").addEventListener("click", () => startJob(filterValues()));

  // The floating indicator of background exports (bottom right).
  const job = { id: null, timer: null, seen: [] };

  function showJob(state, title, body, progress) {
    const box = $("job");
    box.hidden = false;
    box.className = `job ${state}`;
    $("job-title").textContent = title;
    $("job-body").textContent = body;
    $("job-progress-wrap").hidden = state !== "processing";
    $("job-progress").style.width = `${Math.round((progress || 0) * 100)}%`;
    $("job-download").hidden = state !== "ready";
    if (job.seen[job.seen.length - 1] !== state) job.seen.push(state);
    box.dataset.states = job.seen.join(",");
  }

  async function startJob(filters) {
    clearTimeout(job.timer);
    job.seen = [];
    const body = { source: exp.source, format: exp.format, filters, redact: redactValue() };
    if (exp.version) body.version = exp.version;
    const training = trainingValues();
    if (training.dedup_threshold) training.dedup_threshold = Number(training.dedup_threshold);
    Object.assign(body, training);
    const columns = columnsText();
    if (columns) body.columns = columns;
    try {
      const started = await api("exports", { method: "POST", body });
      job.id = started.id;
      showJob("processing", "Processing", `${started.file_name} · 0%`, 0);
      job.timer = setTimeout(pollJob, 700);
    } catch (err) {
      if (err.status !== 401) showJob("failed", "Failed", err.message, 0);
    }
  }

  async function pollJob() {
    if (!job.id) return;
    try {
      const status = await api(`exports/${job.id}`);
      if (status.status === "processing") {
        showJob("processing", "Processing", `${status.file_name} · ${Math.round(status.progress * 100)}%`, status.progress);
        job.timer = setTimeout(pollJob, 700);
      } else if (status.status === "ready") {
        showJob("ready", "Export ready", `${status.file_name} · ${(status.records || 0).toLocaleString()} rows`, 1);
        job.download = status.download;
      } else {
        showJob("failed", "Failed", status.error || "the export failed", 0);
      }
    } catch (err) {
      if (err.status !== 401) showJob("failed", "Failed", err.message, 0);
    }
  }

  $("job-download").addEventListener("click", async () => {
    if (!job.download) return;
    try {
      const response = await fetch(job.download, { headers: { Authorization: `Bearer ${token}` } });
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      await saveResponse(response);
    } catch (err) {
      toast(`Download failed: ${err.message}`);
    }
  });
  $("job-close").addEventListener("click", () => {
    clearTimeout(job.timer);
    job.id = null;
    $("job").hidden = true;
  });

  // --- the columns dialog of tabular exports ----------------------------------------------
  function defaultColumns() {
    const meta = config.metadata_columns;
    const rest = config.fields.filter((f) => !meta.includes(f));
    return [...meta, ...rest].map((path) => ({ path, header: path, on: true }));
  }

  let draft = [];

  async function evaluatorNames() {
    try {
      const sample = await api(`records?${new URLSearchParams({ source: exp.source, format: "trajectory", limit: "20" })}`);
      const names = new Set();
      for (const r of sample.items) for (const k of Object.keys(r.evaluator_scores || {})) names.add(k);
      return [...names].sort();
    } catch (_) {
      return [];
    }
  }

  function nestedKeys(path, evaluators) {
    if (path === "evaluator_scores") return evaluators;
    return config.nested[path] || [];
  }

  async function openColumns() {
    const evaluators = await evaluatorNames();
    const applied = exp.columns || defaultColumns();
    draft = applied.map((c) => ({ ...c, on: true }));
    for (const column of defaultColumns()) {
      if (!draft.some((c) => c.path === column.path)) draft.push({ ...column, on: false });
    }
    draft.evaluators = evaluators;
    renderColumns();
    $("columns-dialog").showModal();
    const first = $("columns-list").querySelector("input");
    if (first) first.focus();
  }

  function renderColumns() {
    const list = $("columns-list");
    list.replaceChildren();
    draft.forEach((column, index) => {
      const nested = column.path.includes(".");
      const keys = nestedKeys(column.path, draft.evaluators || []);
      const box = h("input", { type: "checkbox", "aria-label": `include ${column.path}` });
      box.checked = column.on;
      box.addEventListener("change", () => { column.on = box.checked; });
      const header = h("input", { type: "text", value: column.header, "aria-label": `header of ${column.path}` });
      header.addEventListener("input", () => { column.header = header.value.replace(/,/g, " "); });
      const up = h("button", { type: "button", class: "move", "aria-label": `move ${column.path} up` }, "↑");
      const down = h("button", { type: "button", class: "move", "aria-label": `move ${column.path} down` }, "↓");
      up.disabled = index === 0;
      down.disabled = index === draft.length - 1;
      up.addEventListener("click", () => move(index, -1));
      down.addEventListener("click", () => move(index, 1));
      const expand = keys.length && !nested
        ? h("button", { type: "button", class: "expand", "aria-label": `keys of ${column.path}` }, "keys ▸")
        : h("span", {});
      if (keys.length && !nested) expand.addEventListener("click", () => addKeys(index, keys));
      list.append(h("li", { class: `col-item${nested ? " nested" : ""}`, "data-path": column.path },
        box, h("span", { class: "path" }, column.path), header, expand, h("span", {}, up, down)));
    });
  }

  function move(index, delta) {
    const to = index + delta;
    if (to < 0 || to >= draft.length) return;
    const [item] = draft.splice(index, 1);
    draft.splice(to, 0, item);
    renderColumns();
    const row = $("columns-list").children[to];
    const button = row && row.querySelectorAll(".move")[delta < 0 ? 0 : 1];
    if (button && !button.disabled) button.focus();
    else if (row) row.querySelector("input").focus();
  }

  function addKeys(index, keys) {
    const parent = draft[index].path;
    const fresh = keys.map((k) => `${parent}.${k}`).filter((p) => !draft.some((c) => c.path === p));
    draft.splice(index + 1, 0, ...fresh.map((path) => ({ path, header: path, on: true })));
    draft[index].on = false; // the keys replace the whole object by default
    renderColumns();
    const row = $("columns-list").children[index + 1];
    if (row) row.querySelector("input").focus();
  }

  $("columns-open").addEventListener("click", openColumns);
  $("columns-reset").addEventListener("click", () => {
    draft = defaultColumns().map((c) => ({ ...c }));
    draft.evaluators = [];
    renderColumns();
  });
  $("columns-dialog").addEventListener("close", () => {
    if ($("columns-dialog").returnValue !== "apply") return;
    const chosen = draft.filter((c) => c.on).map((c) => ({ path: c.path, header: c.header.trim() || c.path }));
    exp.columns = chosen.length ? chosen : null;
    refreshExport();
  });

  // =====================================================================================
  // Agreement tab: the report of GET agreement, over the Export tab's filters
  // =====================================================================================
  const READINGS = [[0.8, "reliable", "pass"], [0.667, "tentative", "warn"], [-Infinity, "unreliable", "fail"]];

  function fixed(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  function reading(alpha) {
    if (alpha === null || alpha === undefined) {
      return h("span", { class: "muted" }, "not enough data (two labels on two traces at least, with some variation)");
    }
    const [, words, kind] = READINGS.find(([bound]) => alpha >= bound);
    return h("span", { class: `badge ${kind}` }, words);
  }

  function fillTable(id, rows) {
    const body = $(id).querySelector("tbody");
    body.replaceChildren(...rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c)))));
  }

  async function refreshAgreement() {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(filterValues())) {
      if (Array.isArray(value)) value.forEach((v) => params.append(key, v));
      else params.set(key, value);
    }
    const error = $("agreement-error");
    $("agreement-scope").textContent = "computing…";
    let report;
    try {
      report = await api(`agreement${params.size ? `?${params}` : ""}`);
    } catch (failure) {
      $("agreement-scope").textContent = "";
      error.textContent = failure.status === 403
        ? "This token cannot read the agreement report (it has no export scope)."
        : `Could not compute the report: ${failure.message}`;
      error.hidden = false;
      return;
    }
    error.hidden = true;
    if (window.RLXCompare) window.RLXCompare.ratings(params);
    $("agreement-scope").textContent = params.size ? "(filtered)" : "";
    $("agreement-counts").replaceChildren(
      ...[["Traces", report.traces], ["Labeled", report.labeled],
        ["Two labels or more", report.multi_labeled], ["Labelers", report.labelers]]
        .map(([name, value]) => h("span", { class: "pill" }, `${name}: ${value}`)),
      h("span", { class: "pill", title: "When the report's input was read" },
        `As of ${new Date(report.computed_at).toLocaleTimeString()}` +
        (report.updating ? " (new labels since: updating)" : "")));
    const names = [...window.RLXForms.VERSION_0.questions.map((q) => [q.name, q.title]), ["reward", "Reward"]];
    fillTable("agreement-dimensions", names.map(([key, name]) => {
      const found = report.dimensions[key];
      const ci = found.ci95 ? `${fixed(found.ci95[0], 3)} – ${fixed(found.ci95[1], 3)}` : "–";
      return [name, fixed(found.alpha, 3), ci, String(found.units), reading(found.alpha)];
    }));
    const byQuestion = report.by_question;
    $("agreement-questions-box").hidden = !byQuestion;
    if (byQuestion) {
      $("agreement-questions-title").textContent = `By question: rubric version ${byQuestion.rubric_version} (${byQuestion.multi_labeled} trace${byQuestion.multi_labeled === 1 ? "" : "s"} with two labels or more of it)`;
      const rows = Object.entries(byQuestion.questions).map(([name, found]) => {
        const ci = found.ci95 ? `${fixed(found.ci95[0], 3)} – ${fixed(found.ci95[1], 3)}` : "–";
        return [name, found.kind, found.level || "none (text)", fixed(found.alpha, 3), ci, String(found.units),
          found.level ? reading(found.alpha) : h("span", { class: "muted" }, "not measured")];
      });
      const reward = byQuestion.reward;
      rows.push(["reward", "", "interval", fixed(reward.alpha, 3),
        reward.ci95 ? `${fixed(reward.ci95[0], 3)} – ${fixed(reward.ci95[1], 3)}` : "–", String(reward.units), reading(reward.alpha)]);
      fillTable("agreement-questions", rows);
    }
    $("agreement-adjudicated").textContent = report.adjudicated
      ? `${report.adjudicated} trace${report.adjudicated === 1 ? "" : "s"} decided by a reviewer: the alphas measure the labels, before review.` : "";
    fillTable("agreement-labelers", report.labelers_detail.map((d) => [
      d.labeler, String(d.labels), String(d.skips), fixed(d.mean_reward, 3), fixed(d.mean_abs_diff, 3)]));
    fillTable("agreement-evaluators", report.evaluators.map((e) => [
      e.evaluator, String(e.traces), fixed(e.spearman, 3), fixed(e.pass_kappa, 3)]));
  }

  // --- start -------------------------------------------------------------------------------
  async function start() {
    if (!token) {
      askToken("");
      return;
    }
    let me;
    try {
      me = await api("whoami");
    } catch (error) {
      if (error.status === 403) askToken(`This token cannot open this page: ${error.message}`);
      else if (error.status !== 401) toast(`Could not check the token: ${error.message}`);
      return;
    }
    label.me = me;
    const scopes = me.scopes || [];
    label.mayLabel = scopes.includes("label") || scopes.includes("admin");
    // An admin may have come for the settings or the exports: they start labeling explicitly.
    label.started = !scopes.includes("admin");
    $("token-panel").hidden = true;
    $("who").hidden = false;
    $("who-text").textContent = `Signed in as ${me.subject} (${scopes.join(", ") || "no scope"})`;
    $("version-pin").hidden = !scopes.includes("admin");
    $("tab-review").hidden = !scopes.includes("review");
    if (scopes.includes("export") || scopes.includes("admin")) loadVersions();
    await loadRubric();
    selectTab(activeTab, false);
    await loadSettings(false);
  }

  window.RLX = { api, h, renderMessages, toast, ApiError, active: () => activeTab };
  label.form.render(null);
  // compare.js runs after this file (both deferred, in order): start once it has.
  document.addEventListener("DOMContentLoaded", () => start());
})();
