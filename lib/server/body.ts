// Reading a JSON request body: content type, a size limit that holds for chunked uploads too,
// a deadline for the whole body (a client that sends a byte now and then, or declares more
// bytes than it sends, is cut off with 408), and JSON syntax, each refused with its own status
// and message.
import { ApiError } from "./errors.ts";

export interface BodyLimits {
  /** Largest body in bytes; larger ones get 413. */
  maxBytes: number;
  /** Time for the whole body to arrive, from when the handler starts reading it (ms; default 30 s). */
  timeoutMs?: number;
  /**
   * Bodies being received at once, shared by a server's requests: past `max`, a request is
   * refused at once (503, connection closed) instead of holding a connection (and a file
   * descriptor) until its deadline, so a crowd of idle uploads cannot starve other clients.
   */
  receiving?: { count: number; max: number };
}

/** The body deadline when none is given (ms). */
export const DEFAULT_BODY_TIMEOUT_MS = 30_000;

/**
 * The body as JSON. A missing Content-Type is accepted (many scripts and clients leave it
 * out) unless the request comes from a browser page (an Origin header): a page may send a
 * typeless body cross-origin without a CORS preflight, so there the header stays required.
 */
export async function readJsonBody(req: Request, limits: number | BodyLimits): Promise<unknown> {
  const { maxBytes, timeoutMs = DEFAULT_BODY_TIMEOUT_MS, receiving } = typeof limits === "number" ? ({ maxBytes: limits } as BodyLimits) : limits;
  const type = req.headers.get("content-type");
  const mediaType = (type ?? "").split(";")[0]!.trim().toLowerCase();
  const typeless = type === null && !req.headers.has("origin");
  if (mediaType !== "application/json" && !typeless)
    throw new ApiError(
      415,
      `Content-Type must be application/json (got ${type === null ? "none, from a browser page" : `"${type}"`}); with curl add -H "Content-Type: application/json"`,
      null,
      "unsupported_media_type",
    );
  const declared = Number(req.headers.get("content-length") ?? NaN);
  if (declared > maxBytes) throw tooLarge(maxBytes);
  if (!req.body) throw new ApiError(400, "the request body is empty: send a JSON object", null, "invalid_body");
  if (receiving && receiving.count >= receiving.max)
    throw new ApiError(503, `the server is busy: ${receiving.count} request bodies are being received`, null, "too_many_uploads", undefined, { connection: "close" });
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = req.body.getReader();
  if (receiving) receiving.count++;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(tooSlow(timeoutMs, size, declared)), timeoutMs);
  });
  try {
    for (;;) {
      const { done, value } = await Promise.race([reader.read(), expired]);
      if (done) break;
      size += value.byteLength;
      if (size > maxBytes) throw tooLarge(maxBytes);
      chunks.push(value);
    }
  } catch (e) {
    // the rest of the body is not wanted: the connection closes with the answer
    reader.cancel().catch(() => {});
    throw e;
  } finally {
    clearTimeout(timer);
    if (receiving) receiving.count--;
  }
  const text = new TextDecoder().decode(Buffer.concat(chunks));
  if (text.trim() === "") throw new ApiError(400, "the request body is empty: send a JSON object", null, "invalid_body");
  try {
    return JSON.parse(text);
  } catch (e) {
    const hint = typeless ? " (the request has no Content-Type; send application/json)" : "";
    throw new ApiError(400, `the request body is not valid JSON${hint}: ${(e as Error).message}`, null, "invalid_json");
  }
}

function tooLarge(maxBytes: number): ApiError {
  return new ApiError(413, `the request body is larger than ${maxBytes} bytes`, null, "body_too_large", undefined, { connection: "close" });
}

function tooSlow(timeoutMs: number, got: number, declared: number): ApiError {
  const of = Number.isFinite(declared) ? ` of the ${declared} declared by Content-Length` : "";
  return new ApiError(408, `the request body did not arrive within ${timeoutMs / 1000} s (${got} bytes${of} came)`, null, "body_timeout", undefined, { connection: "close" });
}
