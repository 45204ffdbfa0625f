// Keyboard teleop pad: while it has focus, every key press and release goes to the kernel as
// {type: "key", key, down}; losing focus sends {type: "blur"} (the kernel then lets go of every key).
// Keys are kept from JupyterLab (no notebook shortcuts fire while the pad is focused), except Tab
// and Ctrl/Alt/Meta combinations, which keep their usual meaning.
function render({ model, el }) {
  const pad = document.createElement("div");
  pad.className = "rnb-teleop-pad";
  pad.tabIndex = 0;
  pad.setAttribute("data-lm-suppress-shortcuts", "true");
  pad.setAttribute("role", "application");
  Object.assign(pad.style, {
    border: "2px dashed #999", borderRadius: "6px", padding: "8px 12px", minWidth: "260px",
    cursor: "pointer", userSelect: "none", outline: "none", fontFamily: "monospace", fontSize: "12px",
  });
  const show = () => {
    pad.textContent = model.get("label");
    const focused = document.activeElement === pad;
    pad.style.borderStyle = focused ? "solid" : "dashed";
    pad.style.borderColor = model.get("active") ? (focused ? "#d62728" : "#ff7f0e") : (focused ? "#1f77b4" : "#999");
    pad.style.background = focused ? "#f4f8fc" : "";
  };
  const passThrough = (e) => e.key === "Tab" || e.ctrlKey || e.metaKey || e.altKey;
  const key = (e) => (e.key === " " ? "space" : e.key.toLowerCase());
  const onDown = (e) => {
    if (passThrough(e)) return;
    e.preventDefault();
    e.stopPropagation();
    if (!e.repeat) model.send({ type: "key", key: key(e), down: true });
  };
  const onUp = (e) => {
    if (passThrough(e)) return;
    e.preventDefault();
    e.stopPropagation();
    model.send({ type: "key", key: key(e), down: false });
  };
  const onFocus = () => {
    model.set("focused", true);
    model.save_changes();
    show();
  };
  const onBlur = () => {
    model.set("focused", false);
    model.save_changes();
    model.send({ type: "blur" });
    show();
  };
  const onMouseDown = (e) => {
    e.stopPropagation(); // the notebook would take the focus back on its own mousedown
    pad.focus();
  };
  pad.addEventListener("keydown", onDown);
  pad.addEventListener("keyup", onUp);
  pad.addEventListener("focus", onFocus);
  pad.addEventListener("blur", onBlur);
  pad.addEventListener("mousedown", onMouseDown);
  model.on("change:label", show);
  model.on("change:active", show);
  show();
  el.appendChild(pad);
  return () => {
    pad.removeEventListener("keydown", onDown);
    pad.removeEventListener("keyup", onUp);
    pad.removeEventListener("focus", onFocus);
    pad.removeEventListener("blur", onBlur);
    pad.removeEventListener("mousedown", onMouseDown);
    model.off("change:label", show);
    model.off("change:active", show);
    pad.remove();
  };
}

export default { render };
