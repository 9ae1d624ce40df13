// Errors as OpenAI's API returns them: {error: {message, type, param, code}} with an HTTP status.

export interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

/** A request the server refuses or could not serve; `param` names the offending field. */
export class ApiError extends Error {
  override name = "ApiError";
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly type: string = status >= 500 ? "server_error" : "invalid_request_error",
    /** Extra response headers (Allow on 405). */
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }

  toBody(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** 400 for a field: the message starts with the field's name. */
export function fieldError(param: string, message: string, code: string | null = null): ApiError {
  return new ApiError(400, `${param}: ${message}`, param, code);
}

export function isAbortError(e: unknown): boolean {
  return e instanceof Error && (e.name === "AbortError" || e.name === "TimeoutError");
}

/** Any thrown value as an ApiError (unknown failures become 500 with their message). */
export function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  return new ApiError(500, e instanceof Error ? e.message : String(e));
}
