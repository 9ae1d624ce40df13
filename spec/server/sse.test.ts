// SSE framing.
import { expect, test } from "bun:test";
import { sseData } from "../../lib/server/sse.ts";

test("sseData frames one JSON value as an SSE data event", () => {
  expect(new TextDecoder().decode(sseData({ a: "x\ny" }))).toBe('data: {"a":"x\\ny"}\n\n');
});
