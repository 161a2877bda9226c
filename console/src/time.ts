// Times as the console shows them. Deadlines are counted down against the
// gateway's clock: every answer's `Date` header tells how far this
// browser's clock is from it.

let skewMs = 0;

/** Records the gateway's clock from an answer's `Date` header (1 s resolution). */
export function noteServerDate(header: string | null): void {
  if (!header) return;
  const server = Date.parse(header);
  if (Number.isNaN(server)) return;
  const offset = server - Date.now();
  // The header is truncated to the second: ignore differences under that.
  skewMs = Math.abs(offset) > 1500 ? offset : 0;
}

/** Now, on the gateway's clock. */
export function serverNow(): number {
  return Date.now() + skewMs;
}

const numbers = new Intl.NumberFormat("en");

export function count(n: number): string {
  return numbers.format(n);
}

/** "4m 05s", "1h 02m", "12s". */
export function span(ms: number): string {
  const total = Math.max(0, Math.round(ms / 1000));
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  if (h > 0) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m > 0) return `${m}m ${String(s).padStart(2, "0")}s`;
  return `${s}s`;
}

/** A moment in local time, with the date when it is not today. */
export function clock(iso: string): string {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return iso;
  const today = new Date().toDateString() === at.toDateString();
  const time = at.toLocaleTimeString("en-GB", { hour12: false });
  return today ? time : `${at.toLocaleDateString("en-CA")} ${time}`;
}

/** "3m 10s ago". */
export function ago(iso: string, now: number): string {
  const at = Date.parse(iso);
  if (Number.isNaN(at)) return iso;
  return `${span(now - at)} ago`;
}
