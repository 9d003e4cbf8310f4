// Conversations and settings, kept in the browser's localStorage (nothing on the server).
const CONVERSATIONS = "edge-chat.conversations";
const CURRENT = "edge-chat.current";
const SETTINGS = "edge-chat.settings";

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export class Store {
  constructor() {
    const saved = read(CONVERSATIONS, []);
    this.conversations = Array.isArray(saved) ? saved.filter((c) => c && c.id) : [];
    this.currentId = read(CURRENT, null);
    this.settings = { temperature: "", top_p: "", max_tokens: "", seed: "", json_schema: "",
      theme: "", ...read(SETTINGS, {}) };
    if (!this.current()) this.currentId = this.conversations[0]?.id ?? null;
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId) ?? null;
  }

  create(model) {
    const conversation = { id: newId(), title: "New chat", titled: false, model, system: "",
      messages: [], updated: Date.now() };
    this.conversations.unshift(conversation);
    this.currentId = conversation.id;
    this.save();
    return conversation;
  }

  select(id) {
    this.currentId = id;
    this.save();
  }

  rename(id, title) {
    const conversation = this.conversations.find((c) => c.id === id);
    if (!conversation || !title.trim()) return;
    conversation.title = title.trim().slice(0, 200);
    conversation.titled = true;
    this.save();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations[0]?.id ?? null;
    this.save();
  }

  touch(conversation) {
    conversation.updated = Date.now();
    if (!conversation.titled) {
      const first = conversation.messages.find((m) => m.role === "user" && m.content.trim());
      if (first) conversation.title = first.content.trim().replace(/\s+/g, " ").slice(0, 48);
    }
  }

  // Returns an error message when the browser's storage is full, else null.
  save() {
    try {
      localStorage.setItem(CONVERSATIONS, JSON.stringify(this.conversations));
      localStorage.setItem(CURRENT, JSON.stringify(this.currentId));
      localStorage.setItem(SETTINGS, JSON.stringify(this.settings));
      return null;
    } catch (error) {
      return `Could not save the conversations in this browser (${error.name}): ` +
        "delete some, or attach fewer images.";
    }
  }
}
