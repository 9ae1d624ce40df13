// Server-sent events as OpenAI streams them ("data: {json}\n\n" ... "data: [DONE]\n\n"). Stop
// strings are held back by Model.stream() itself (lib/api/stop-holdback.ts).

const encoder = new TextEncoder();

export function sseData(value: unknown): Uint8Array {
  return encoder.encode(`data: ${JSON.stringify(value)}\n\n`);
}

/** A named event (`event: type`), as the Responses API streams. */
export function sseEvent(type: string, value: unknown): Uint8Array {
  return encoder.encode(`event: ${type}\ndata: ${JSON.stringify(value)}\n\n`);
}

export const SSE_DONE = encoder.encode("data: [DONE]\n\n");

export const SSE_HEADERS = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  // reverse proxies (nginx) would otherwise buffer the stream
  "x-accel-buffering": "no",
};
