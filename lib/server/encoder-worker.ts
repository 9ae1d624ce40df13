// The server's prompt encoder, off the event loop: runs EncoderJobs (encoder-jobs.ts) so that
// a huge prompt or a slow template never delays /health or other requests.
import { EncoderJobs } from "./encoder-jobs.ts";
import type { EncoderRequest } from "./encoder.ts";

declare const self: Worker;

const jobs = new EncoderJobs();

self.onmessage = async (event: MessageEvent<EncoderRequest>) => {
  self.postMessage(await jobs.run(event.data));
};
