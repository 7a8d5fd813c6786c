// The Compare tab of the RL Export page: two trajectories that share a prompt, side by side,
// the messages that differ marked; the labeler picks the better (A, B), a tie (T) or both bad
// (X), optionally how much better (1-3), and may undo the last choice (U). One pair is claimed
// at a time (POST compare/claim); leaving the tab gives it back. Everything from a trace is put
// on the page as text (rl_export.js's helpers): transcripts are untrusted. Blind: the items
// carry nobody's choices, and the page shows no agent version (which side is which version is
// for the ratings, not for the labeler).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const { api, h, renderMessages, toast } = window.RLX;
  const KEYS = { a: "a", b: "b", t: "tie", x: "both_bad" };
  const state = {
    me: null, started: false, entered: false, current: null, claim: null, last: null,
    busy: false, work: Promise.resolve(),
  };

  // Every step that claims or gives back runs after the previous one.
  function serial(step) {
    const run = state.work.then(step, step);
    state.work = run.catch(() => {});
    return run;
  }

  function show(which) {
    for (const name of ["start", "empty", "work"]) $(`compare-${name}`).hidden = name !== which;
  }

  function counts(answer) {
    $("compare-count").textContent = `${answer.remaining} pair${answer.remaining === 1 ? "" : "s"} to compare`;
    $("compare-team").textContent = `Team: ${answer.team_remaining} short of their target`;
  }

  function showClaim() {
    const box = $("compare-claim");
    if (!state.claim) {
      box.hidden = true;
      return;
    }
    const until = new Date(state.claim.expires_at);
    box.hidden = false;
    box.textContent = `Claimed by ${state.me ? state.me.subject : "you"} until ${until.toLocaleTimeString()}`;
  }

  // A message as a comparable string: differences are marked where the two sides' messages
  // at one place are not the same.
  const same = (x, y) => JSON.stringify(x) === JSON.stringify(y);

  function markDifferences(a, b) {
    const ma = Array.isArray(a.messages) ? a.messages : [];
    const mb = Array.isArray(b.messages) ? b.messages : [];
    for (const [list, mine, theirs] of [[$("compare-a"), ma, mb], [$("compare-b"), mb, ma]]) {
      [...list.children].forEach((item, index) => {
        if (index < theirs.length && same(mine[index], theirs[index])) return;
        item.classList.add("differs");
        item.setAttribute("aria-label", `${item.getAttribute("aria-label")}, differs`);
        item.querySelector(".msg-head").append(h("span", { class: "differs-tag" }, "differs"));
      });
    }
  }

  function meta(record, box) {
    const turns = Array.isArray(record.messages) ? record.messages.length : 0;
    box.replaceChildren(h("span", { class: "tag" }, String(record.trace_id)),
      h("span", { class: "muted" }, `${turns} message${turns === 1 ? "" : "s"}`));
  }

  function showPair(item) {
    state.current = item;
    renderMessages(item.a.messages, $("compare-a"));
    renderMessages(item.b.messages, $("compare-b"));
    meta(item.a, $("compare-a-meta"));
    meta(item.b, $("compare-b-meta"));
    markDifferences(item.a, item.b);
    for (const radio of document.querySelectorAll("#compare-form input[name=strength]")) {
      radio.checked = false;
    }
    $("compare-comment").value = "";
    $("compare-error").hidden = true;
    show("work");
    showClaim();
  }

  function showUndo() {
    const last = state.last;
    $("compare-undo-line").hidden = !last;
    if (last) $("compare-undo-text").textContent = `Saved: ${last.said} (${last.item.pair_id}).`;
  }

  async function claimNext() {
    const answer = await api("compare/claim", { method: "POST", body: { limit: 1 } });
    counts(answer);
    state.claim = answer.claims[0] || null;
    if (!answer.items.length) {
      state.current = null;
      showClaim();
      show("empty");
      return;
    }
    showPair(answer.items[0]);
  }

  async function giveBack() {
    const current = state.current;
    if (!current || !state.claim) return;
    state.claim = null;
    try {
      await api(`compare/claims/${current.pair_id}`, { method: "DELETE" });
    } catch (_) { /* expired or already given: nothing held */ }
  }

  const WORDS = { a: "A is better", b: "B is better", tie: "tie", both_bad: "both bad" };

  function choose(choice) {
    const item = state.current;
    if (!item || state.busy) return;
    const picked = document.querySelector("#compare-form input[name=strength]:checked");
    const body = { trace_a: item.trace_a, trace_b: item.trace_b, choice };
    if (picked && (choice === "a" || choice === "b")) body.strength = Number(picked.value);
    const comment = $("compare-comment").value.trim();
    if (comment) body.comment = comment;
    act(async () => {
      try {
        await api("comparisons", { method: "POST", body });
      } catch (error) {
        $("compare-error").hidden = false;
        $("compare-error").textContent = `Not saved: ${error.message}`;
        return;
      }
      state.last = { item, said: WORDS[choice] };
      state.claim = null;
      showUndo();
      await claimNext();
    });
  }

  function undo() {
    const last = state.last;
    if (!last || state.busy) return;
    act(async () => {
      try {
        await api(`comparisons/${last.item.pair_id}`, { method: "DELETE" });
      } catch (error) {
        toast(`Could not undo: ${error.message}`);
        return;
      }
      await giveBack();
      state.last = null;
      showUndo();
      // The pair is free again: claim it by name before showing it.
      try {
        state.claim = await api(`compare/claims/${last.item.pair_id}`, { method: "PUT" });
      } catch (error) {
        toast(`Undone, but the pair went to a teammate meanwhile (${error.message}).`);
        await claimNext();
        return;
      }
      showPair(last.item);
    });
  }

  function act(step) {
    state.busy = true;
    $("compare-work").setAttribute("aria-busy", "true");
    return serial(step).finally(() => {
      state.busy = false;
      $("compare-work").setAttribute("aria-busy", "false");
    });
  }

  function enter(me) {
    state.me = me;
    if (!me) return;
    state.entered = true;
    const scopes = me.scopes || [];
    if (!state.started && scopes.includes("admin")) {  // an admin starts explicitly
      show("start");
      serial(async () => { counts(await api("compare/queue?limit=1")); }).catch(() => {});
      return;
    }
    state.started = true;
    serial(async () => {
      try {
        await claimNext();
      } catch (error) {
        $("compare-count").textContent = `Could not load the comparisons: ${error.message}`;
      }
    });
  }

  function leave() {
    if (!state.entered) return;
    state.entered = false;
    serial(giveBack);
  }

  function key(event, typing) {
    const target = event.target;
    if (typing) {
      if (target.id === "compare-comment" && event.key === "Escape") {
        event.preventDefault();
        target.blur();
      }
      return;
    }
    if (event.ctrlKey) return;
    const lower = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    if (lower === "u" && state.last) {
      event.preventDefault();
      undo();
      return;
    }
    if (!state.current || $("compare-work").hidden) return;
    if (state.busy && event.key !== "Tab") {
      event.preventDefault();
      return;
    }
    if (KEYS[lower]) {
      event.preventDefault();
      choose(KEYS[lower]);
    } else if (["1", "2", "3"].includes(lower)) {
      event.preventDefault();
      const radio = document.querySelector(`#compare-form input[name=strength][value="${lower}"]`);
      if (radio) radio.checked = true;
    }
  }

  // A browser tab hidden a minute gives its pair back (as the Label tab its trace); seen
  // again, it claims the next pair (maybe the same).
  const HIDDEN_RELEASE_MS = 60000;
  let hiddenTimer = null;
  document.addEventListener("visibilitychange", () => {
    clearTimeout(hiddenTimer);
    hiddenTimer = null;
    if (!state.entered || !state.started) return;
    if (document.visibilityState === "hidden") {
      hiddenTimer = setTimeout(() => { serial(giveBack); }, HIDDEN_RELEASE_MS);
    } else if (!state.claim) {
      serial(async () => {
        const gone = state.current;
        await claimNext();
        if (gone && (!state.current || state.current.pair_id !== gone.pair_id)) {
          toast("A teammate took the pair you were comparing while you were away.");
        }
      });
    }
  });

  for (const button of document.querySelectorAll("#compare-form [data-choice]")) {
    button.addEventListener("click", () => choose(button.dataset.choice));
  }
  $("compare-undo").addEventListener("click", undo);
  $("compare-refresh").addEventListener("click", () => {
    serial(async () => { await claimNext(); });
  });
  $("compare-start-button").addEventListener("click", () => {
    state.started = true;
    serial(async () => { await claimNext(); });
  });

  // --- the Agreement tab's ratings: GET comparisons/ratings, intervals drawn to scale ------
  const num = (value, digits) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));

  function bar(rating, low, high) {
    const span = Math.max(high - low, 1);
    const at = (value) => `${(100 * (value - low)) / span}%`;
    const track = h("div", {
      class: "rating-track", role: "img",
      "aria-label": rating.rating === null ? "no rating"
        : `rating ${num(rating.rating, 0)}, 95 % interval ${rating.ci95 ? `${num(rating.ci95[0], 0)} to ${num(rating.ci95[1], 0)}` : "unknown"}`,
    });
    const mid = h("span", { class: "rating-mid" });
    mid.style.left = at(1000);  // CSSOM, not a style attribute: the page's CSP allows it
    track.append(mid);
    if (rating.ci95) {
      const ci = h("span", { class: "rating-ci" });
      ci.style.left = at(rating.ci95[0]);
      ci.style.width = `${(100 * (rating.ci95[1] - rating.ci95[0])) / span}%`;
      track.append(ci);
    }
    if (rating.rating !== null) {
      const point = h("span", { class: "rating-point" });
      point.style.left = at(rating.rating);
      track.append(point);
    }
    return track;
  }

  async function ratings(params) {
    const error = $("ratings-error");
    let report;
    try {
      report = await api(`comparisons/ratings${params.size ? `?${params}` : ""}`);
    } catch (failure) {
      error.hidden = false;
      error.textContent = `Could not compute the ratings: ${failure.message}`;
      return;
    }
    error.hidden = true;
    const rows = report.ratings;
    const values = rows.flatMap((r) => (r.ci95 ? r.ci95 : r.rating === null ? [] : [r.rating]));
    const low = Math.min(1000, ...values) - 10;
    const high = Math.max(1000, ...values) + 10;
    $("ratings-bars").replaceChildren(...rows.map((r) => h("li", {},
      h("span", {}, String(r.agent_version)), bar(r, low, high),
      h("span", { class: "muted" }, r.rating === null ? "no finite rating yet"
        : `${num(r.rating, 0)} (${r.ci95 ? `${num(r.ci95[0], 0)}–${num(r.ci95[1], 0)}` : "–"})`))));
    const body = $("ratings-table").querySelector("tbody");
    body.replaceChildren(...rows.map((r) => h("tr", {},
      h("td", {}, String(r.agent_version)), h("td", {}, num(r.rating, 1)),
      h("td", {}, r.ci95 ? `${num(r.ci95[0], 1)} – ${num(r.ci95[1], 1)}` : "–"),
      h("td", {}, String(r.comparisons)))));
    if (!rows.length) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "muted" },
        "No comparisons between two agent versions yet.")));
    }
    const a = report.agreement;
    $("ratings-agreement").textContent = a.pairs
      ? `Labelers agree on ${num(100 * a.percent, 0)} % of the pairs two or more compared (${a.pairs} pair${a.pairs === 1 ? "" : "s"}); Krippendorff's alpha ${num(a.alpha, 3)}.`
      : "No pair was compared by two labelers yet: no agreement to report.";
  }

  window.RLXCompare = { enter, leave, key, ratings };
})();
