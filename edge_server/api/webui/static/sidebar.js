// The list of conversations: select, rename in place, delete.
import { button } from "./render.js";

export function renderConversations(list, store, { select, remove, renamed }) {
  list.replaceChildren();
  for (const conversation of store.conversations) {
    const item = document.createElement("li");
    item.classList.toggle("current", conversation.id === store.currentId);
    item.dataset.id = conversation.id;
    const title = button(conversation.title, () => select(conversation.id), "title");
    const renameButton = button("✎", () => startRename(item, conversation, store, renamed),
      "icon rename");
    renameButton.setAttribute("aria-label", "Rename");
    const deleteButton = button("✕", () => remove(conversation), "icon delete");
    deleteButton.setAttribute("aria-label", "Delete");
    item.append(title, renameButton, deleteButton);
    list.append(item);
  }
}

function startRename(item, conversation, store, renamed) {
  const input = document.createElement("input");
  input.value = conversation.title;
  input.setAttribute("aria-label", "Conversation name");
  let finished = false;
  const finish = (keep) => {
    if (finished) return;
    finished = true;
    if (keep) store.rename(conversation.id, input.value);
    renamed();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  item.replaceChildren(input);
  input.focus();
  input.select();
}
