// The login: a form for a bearer token of the server's --auth-file. The
// token is kept in this tab's sessionStorage only, and nothing is read from
// the API until the server accepts it.

import { session } from "./api.js";
import { h, replace } from "./dom.js";

export function mount({ main, message, onToken }) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "current-password", required: true, placeholder: "token", "aria-label": "token" });
  const err = h("p", { class: "error", id: "login-error", role: "alert" }, message || "");
  const form = h("form", { id: "login" },
    h("label", { for: "token" }, "Bearer token"),
    input,
    err,
    h("button", { type: "submit" }, "Log in"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (!t) return;
    session.setToken(t);
    err.textContent = "";
    onToken();
  });
  replace(main, h("section", { class: "panel login" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, "This server requires a token (its --auth-file). It stays in this tab only and is sent as a bearer token to the API."),
    form));
  input.focus();
}
