// The output items of recent responses, kept in memory so that an `item_reference` input item
// resolves: OpenAI stores responses by default, and clients built on that (the Vercel AI SDK
// with its default store: true) send earlier assistant turns as references instead of text.
// Bounded (least recently used goes first); a server restart forgets everything.

export type StoredItem =
  | { type: "message"; text: string }
  | { type: "function_call"; call_id: string; name: string; arguments: string };

export class ItemStore {
  private items = new Map<string, StoredItem>();
  constructor(readonly capacity: number) {}

  put(id: string, item: StoredItem): void {
    this.items.delete(id);
    this.items.set(id, item);
    while (this.items.size > this.capacity) this.items.delete(this.items.keys().next().value!);
  }

  get(id: string): StoredItem | undefined {
    const item = this.items.get(id);
    if (item) {
      this.items.delete(id);
      this.items.set(id, item);
    }
    return item;
  }

  get size(): number {
    return this.items.size;
  }
}
