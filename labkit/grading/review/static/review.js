// The review page's keys: 1-9 give a rubric item its points (again: 0) and save at once; c a comment;
// n the next ungraded answer; j and k the next and previous answer. Keys typed into a box are the box's.
"use strict";
document.addEventListener("keydown", (event) => {
  const form = document.getElementById("rubric");
  if (!form || event.ctrlKey || event.metaKey || event.altKey) return;
  const target = event.target;
  if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement) {
    if (event.key === "Escape") target.blur();
    return;
  }
  const box = document.getElementById(`points-${event.key}`);
  if (/^[1-9]$/.test(event.key) && box) {
    event.preventDefault();
    box.value = box.value === box.dataset.max ? "0" : box.dataset.max;
    form.requestSubmit();
    return;
  }
  const go = { n: "ungraded", j: "next", k: "previous" }[event.key];
  if (go) {
    event.preventDefault();
    document.getElementById(go).click();
  } else if (event.key === "c") {
    event.preventDefault();
    const first = form.querySelector("input.comment");
    if (first) first.focus();
  }
});
