// The chat request a conversation and the settings make, and an answer's figures.
function number(text, parse) {
  return text === "" || text === undefined ? undefined : parse(text);
}

export function requestBody(conversation, s) {
  const messages = [];
  if (conversation.system.trim()) messages.push({ role: "system", content: conversation.system });
  for (const m of conversation.messages) {
    if (m.role === "assistant" && (m.state === "error" || !m.content)) continue;
    if (m.role === "user" && m.images?.length) {
      const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
      messages.push({ role: "user", content: [...parts, { type: "text", text: m.content }] });
    } else {
      messages.push({ role: m.role, content: m.content });
    }
  }
  const body = {
    model: conversation.model, messages, separate_reasoning: true,
    temperature: number(s.temperature, parseFloat), top_p: number(s.top_p, parseFloat),
    max_tokens: number(s.max_tokens, (v) => parseInt(v, 10)),
    seed: number(s.seed, (v) => parseInt(v, 10)),
  };
  if (s.json_schema.trim()) {
    body.response_format = { type: "json_schema",
      json_schema: { name: "answer", schema: JSON.parse(s.json_schema) } };
  }
  return body;
}

// Per-answer figures: tokens, tokens/s (from the first token on), cached prompt tokens and
// the time to the first token, all measured in the page.
export function answerStats({ started, first, ended, usage, finish }) {
  const stats = { finish_reason: finish };
  if (first !== null) stats.ttft_ms = first - started;
  if (usage) {
    stats.completion_tokens = usage.completion_tokens;
    stats.prompt_tokens = usage.prompt_tokens;
    stats.cached_tokens = usage.prompt_tokens_details?.cached_tokens ?? 0;
    if (first !== null && ended > first) {
      stats.tokens_per_second = usage.completion_tokens / ((ended - first) / 1000);
    }
  }
  return stats;
}
