// The rating form of a rubric (docs/guides/rubrics.md): one row per question, whatever its kind,
// and the keyboard model the Label and Review tabs share. No framework, no build step; every
// text from the rubric goes on the page as text (the guidelines' HTML, rendered safe by the
// server, is put in by the main script).
//
// The keyboard model (the ? overlay and docs/guides/labeling.md say the same): a key answers the
// highlighted question and moves the highlight to the next one: a digit rates a rating (its
// value) or picks the n-th option of a choice, Y or N answers a yes/no question (1 and 2 too);
// + and - step a rating. The arrows move the highlight without answering, and a ↓ (or →) just
// after an answer stays put: the answer moved it already. On a text question the highlight is
// the text box itself: type, then Escape (or Tab) leaves it.
"use strict";

window.RLXForms = (() => {
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

  // The four 1..5 ratings of version 0, when the service does not say (an older service).
  const VERSION_0 = {
    version: 0, guidelines_html: "",
    questions: ["correctness", "helpfulness", "efficiency", "safety"].map((name) => ({
      name, title: name[0].toUpperCase() + name.slice(1), description: "", kind: "rating",
      required: true, weight: 1, min: 1, max: 5, levels: {},
    })),
  };

  function scored(q) {
    if (q.kind === "rating" || q.kind === "boolean") return true;
    return q.kind === "choice" && q.options.length > 0
      && q.options[0].reward !== null && q.options[0].reward !== undefined;
  }

  // A question's answers as the buttons offer them: [value, label, title, description].
  function choicesOf(q) {
    if (q.kind === "rating") {
      const out = [];
      for (let v = q.min; v <= q.max; v += 1) {
        const level = (q.levels || {})[String(v)] || {};
        out.push([v, String(v), level.title || "", level.description || ""]);
      }
      return out;
    }
    if (q.kind === "boolean") return [[true, "Yes", "", ""], [false, "No", "", ""]];
    if (q.kind === "choice") return q.options.map((o) => [o.value, o.title, "", o.description || ""]);
    return [];
  }

  // The label's reward by the rubric's rule: weighted answers over weighted maxima.
  function rewardOf(rubric, answers) {
    let top = 0;
    let bottom = 0;
    for (const q of rubric.questions) {
      const value = answers[q.name];
      if (value === undefined || value === null || !scored(q) || !q.weight) continue;
      if (q.kind === "rating") { top += q.weight * value; bottom += q.weight * q.max; }
      else if (q.kind === "boolean") { top += q.weight * (value ? 1 : 0); bottom += q.weight; }
      else {
        const option = q.options.find((o) => o.value === value);
        top += q.weight * (option ? option.reward : 0);
        bottom += q.weight;
      }
    }
    return bottom ? top / bottom : null;
  }

  class QuestionForm {
    // box: the container; prefix: unique ids; onChange(): after any answer.
    constructor(box, { prefix, onChange }) {
      this.box = box;
      this.prefix = prefix;
      this.onChange = onChange || (() => {});
      this.rubric = VERSION_0;
      this.answers = {};
      this.focused = 0;
      this.moved = false;
      this.active = () => true; // whether focusing may move the page's focus
    }

    render(rubric, prefill) {
      this.rubric = rubric && rubric.questions ? rubric : VERSION_0;
      this.answers = { ...(prefill || {}) };
      this.box.replaceChildren();
      this.rubric.questions.forEach((q, index) => this.box.append(this.row(q, index)));
      this.show();
      this.moved = false;
    }

    row(q, index) {
      const id = `${this.prefix}-q-${index}`;
      const title = h("span", { class: "dim-name", id: `${id}-title` }, q.title,
        q.required && q.kind !== "text" ? h("span", { class: "required", "aria-hidden": "true" }, " *") : null);
      const parts = [title];
      if (q.description) parts.push(h("span", { class: "dim-help muted", id: `${id}-help` }, q.description));
      const note = h("span", { class: "level-note muted", id: `${id}-note`, "aria-live": "polite" });
      if (q.kind === "text") {
        const area = h("textarea", {
          class: "text-answer", rows: "2", "data-q": q.name, "aria-labelledby": `${id}-title`,
          "aria-describedby": q.description ? `${id}-help` : null, maxlength: "10000",
        });
        area.value = this.answers[q.name] || "";
        area.addEventListener("input", () => {
          if (area.value.trim()) this.answers[q.name] = area.value;
          else delete this.answers[q.name];
          this.onChange();
        });
        area.addEventListener("focus", () => { this.focused = index; this.highlight(); });
        parts.push(area);
      } else {
        const group = h("div", {
          class: "scale", role: "radiogroup", "aria-labelledby": `${id}-title`,
          "aria-describedby": q.description ? `${id}-help` : null,
          "aria-required": q.required ? "true" : null,
        });
        choicesOf(q).forEach(([value, text, levelTitle, description], n) => {
          const key = q.kind === "rating" ? "" : (q.kind === "boolean" ? (value ? "Y" : "N") : String(n + 1));
          const meaning = [levelTitle, description].filter(Boolean).join(": ");
          const button = h("button", {
            type: "button", role: "radio", "aria-checked": "false", tabindex: "-1",
            "data-dim": q.name, "data-value": JSON.stringify(value), "data-index": String(n),
            "aria-label": `${q.title} ${text}${levelTitle ? ` (${levelTitle})` : ""}`,
            "aria-describedby": `${id}-note`, title: meaning || null,
          }, text, key ? h("kbd", { class: "option-key", "aria-hidden": "true" }, key) : null);
          button.addEventListener("click", () => { this.answer(index, value); });
          const explain = () => { note.textContent = meaning || ""; };
          button.addEventListener("mouseenter", explain);
          button.addEventListener("focus", explain);
          button.addEventListener("mouseleave", () => this.showNote(index));
          group.append(button);
        });
        parts.push(group);
      }
      parts.push(note);
      return h("div", { class: `dimension kind-${q.kind}`, "data-index": String(index), "data-q": q.name,
        tabindex: "-1" }, parts);
    }

    rows() { return [...this.box.querySelectorAll(":scope > .dimension")]; }

    // The chosen answers shown (aria-checked) and each row's level note.
    show() {
      this.rubric.questions.forEach((q, index) => {
        const row = this.rows()[index];
        if (!row) return;
        for (const button of row.querySelectorAll(".scale button")) {
          const value = JSON.parse(button.dataset.value);
          button.setAttribute("aria-checked", String(this.answers[q.name] === value));
        }
        const area = row.querySelector("textarea");
        if (area && area.value !== (this.answers[q.name] || "")) area.value = this.answers[q.name] || "";
        this.showNote(index);
      });
      this.highlight();
    }

    showNote(index) {
      const q = this.rubric.questions[index];
      const row = this.rows()[index];
      if (!q || !row) return;
      const note = row.querySelector(".level-note");
      const chosen = choicesOf(q).find(([value]) => value === this.answers[q.name]);
      note.textContent = chosen ? [chosen[2], chosen[3]].filter(Boolean).join(": ") : "";
    }

    highlight() {
      this.rows().forEach((row, n) => row.classList.toggle("focused", n === this.focused));
    }

    // Move the highlight to question ``index`` and, when the form is in use, the focus.
    focus(index) {
      const count = this.rubric.questions.length;
      this.focused = Math.max(0, Math.min(count - 1, index));
      this.highlight();
      if (!this.active()) return;
      const row = this.rows()[this.focused];
      if (!row) return;
      const area = row.querySelector("textarea");
      if (area) { area.focus({ preventScroll: false }); return; }
      const q = this.rubric.questions[this.focused];
      const buttons = [...row.querySelectorAll(".scale button")];
      const target = buttons.find((b) => JSON.parse(b.dataset.value) === this.answers[q.name]) || buttons[0];
      buttons.forEach((b) => { b.tabIndex = b === target ? 0 : -1; });
      target.focus({ preventScroll: false });
    }

    answer(index, value) {
      const q = this.rubric.questions[index];
      this.answers[q.name] = value;
      this.show();
      this.onChange();
      const last = index >= this.rubric.questions.length - 1;
      this.focus(last ? index : index + 1);
      this.moved = !last;
    }

    move(step) {
      const absorbed = step > 0 && this.moved;
      this.moved = false;
      if (!absorbed) this.focus(this.focused + step);
    }

    // A key for the highlighted question; true when it was the form's.
    key(event) {
      const q = this.rubric.questions[this.focused];
      if (!q || q.kind === "text") return false;
      const key = event.key;
      if (q.kind === "rating") {
        if (/^[0-9]$/.test(key) && Number(key) >= q.min && Number(key) <= q.max) {
          this.answer(this.focused, Number(key));
          return true;
        }
        if (key === "+" || key === "-") {
          const now = this.answers[q.name];
          const next = now === undefined ? (key === "+" ? q.min : q.max)
            : Math.max(q.min, Math.min(q.max, now + (key === "+" ? 1 : -1)));
          this.answers[q.name] = next;
          this.show();
          this.onChange();
          return true;
        }
        return false;
      }
      if (q.kind === "boolean") {
        const lower = key.toLowerCase();
        if (lower === "y" || key === "1") { this.answer(this.focused, true); return true; }
        if (lower === "n" || key === "2") { this.answer(this.focused, false); return true; }
        return false;
      }
      if (/^[1-9]$/.test(key) && Number(key) <= q.options.length) {
        this.answer(this.focused, q.options[Number(key) - 1].value);
        return true;
      }
      return false;
    }

    // The first required question without an answer (-1: none).
    missing() {
      return this.rubric.questions.findIndex((q) => q.required && (this.answers[q.name] === undefined
        || this.answers[q.name] === null || this.answers[q.name] === ""));
    }

    reward() { return rewardOf(this.rubric, this.answers); }

    // The answers to send: the rubric's questions only, text trimmed.
    payload() {
      const out = {};
      for (const q of this.rubric.questions) {
        const value = this.answers[q.name];
        if (value === undefined || value === null) continue;
        if (q.kind === "text") {
          if (String(value).trim()) out[q.name] = String(value).trim();
        } else {
          out[q.name] = value;
        }
      }
      return out;
    }
  }

  // A label's answers as the record holds them: another version's ``answers``, or a
  // version-0 label's four ratings.
  function answersOf(entry) {
    if (!entry) return null;
    if (entry.answers) return { ...entry.answers };
    return { ...(entry.rubric || {}) };
  }

  // One answer as text, for tables (the labels side by side, My labels).
  function answerText(q, value) {
    if (value === undefined || value === null) return "–";
    if (q && q.kind === "boolean") return value ? "Yes" : "No";
    if (q && q.kind === "choice") {
      const option = q.options.find((o) => o.value === value);
      return option ? option.title : String(value);
    }
    return String(value);
  }

  return { QuestionForm, VERSION_0, rewardOf, answersOf, answerText, choicesOf, h };
})();
