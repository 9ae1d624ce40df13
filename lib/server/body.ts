// Reading a JSON request body: content type, a size limit that holds for chunked uploads too,
// and JSON syntax, each refused with its own status and message.
import { ApiError } from "./errors.ts";

/**
 * The body as JSON. A missing Content-Type is accepted (many scripts and clients leave it
 * out) unless the request comes from a browser page (an Origin header): a page may send a
 * typeless body cross-origin without a CORS preflight, so there the header stays required.
 */
export async function readJsonBody(req: Request, maxBytes: number): Promise<unknown> {
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
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of req.body) {
    size += chunk.byteLength;
    if (size > maxBytes) throw tooLarge(maxBytes);
    chunks.push(chunk);
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
  return new ApiError(413, `the request body is larger than ${maxBytes} bytes`, null, "body_too_large");
}
