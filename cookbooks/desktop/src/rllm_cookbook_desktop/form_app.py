"""The tasks' GUI app (put into each loaded task's files as app.py by forms.with_app; run by the system
python3 on the sandbox's display): a Tk form described by form.json — checkboxes, a choice
list (radio buttons), a text field and a Save button, each placed at its rectangle. Save writes
the form's state to state.json (what the verifier reads); .form-ready appears once it is shown."""

from __future__ import annotations

import json
import os
import tkinter as tk


def main() -> None:
    with open("form.json") as f:
        form = json.load(f)
    root = tk.Tk()
    root.title(form["title"])
    root.geometry(f"{form['width']}x{form['height']}+0+0")
    checks: dict[str, tk.BooleanVar] = {}
    choice = tk.StringVar(value="")
    fields: list[tk.Entry] = []  # the text field, once made (read by Save)
    for widget in form["widgets"]:
        x, y, w, h = widget["rect"]
        kind, label = widget["kind"], widget["label"]
        if kind == "check":
            checks[label] = tk.BooleanVar(value=False)
            made: tk.Widget = tk.Checkbutton(root, text=label, variable=checks[label], anchor="w")
        elif kind == "radio":
            made = tk.Radiobutton(root, text=label, value=label, variable=choice, anchor="w")
        elif kind == "field":
            made = tk.Entry(root)
            fields.append(made)
            tk.Label(root, text=label, anchor="e").place(x=x - 70, y=y, width=65, height=h)
        else:
            made = tk.Button(root, text=label, command=lambda: save(checks, choice, fields))
        made.place(x=x, y=y, width=w, height=h)
    root.update()  # mapped and drawn once this returns
    root.after(50, lambda: open(".form-ready", "w").close())
    root.mainloop()


def save(checks: dict[str, tk.BooleanVar], choice: tk.StringVar, fields: list[tk.Entry]) -> None:
    state = {
        "saved": True,
        "checked": sorted(label for label, var in checks.items() if var.get()),
        "choice": choice.get() or None,
        "text": fields[0].get() if fields else "",
    }
    with open("state.tmp", "w") as f:
        json.dump(state, f)
    os.replace("state.tmp", "state.json")  # the verifier never reads a half-written file


if __name__ == "__main__":
    main()
