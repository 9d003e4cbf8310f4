// The page speaks to this server's OpenAI-compatible API like any other client.
const KEY = "edge-chat.api-key"; // sessionStorage: gone when the tab closes

export class AuthError extends Error {}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body?.error?.message || message;
  } catch {
    // not JSON: keep the status line
  }
  if (response.status === 401) return new AuthError(message);
  return new ApiError(response.status, message);
}

export async function listModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) throw await failure(response);
  return (await response.json()).data;
}

// Server-sent events of a streamed chat completion: calls onChunk with each parsed chunk.
// Resolves when the stream ends; rejects with AbortError when `signal` stops it.
export async function streamChat(body, signal, onChunk) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(500, chunk.error.message || "stream error");
        onChunk(chunk);
      }
    }
  }
}
