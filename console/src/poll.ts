// Reading the API again and again while a page is shown: the next read
// starts a period after the last one ended (never two at once), reads stop
// while the tab is hidden and start again when it is shown.

import { useCallback, useEffect, useRef, useState } from "preact/hooks";

import { ApiError } from "./api";
import { serverNow } from "./time";

export interface Polled<T> {
  data: T | undefined;
  /** The last read's failure; the last data stays shown meanwhile. */
  error: ApiError | undefined;
  /** When the data was last read (browser clock). */
  updatedAt: number | undefined;
  /** Reads again now. */
  refresh: () => void;
}

export function usePoll<T>(
  read: (signal: AbortSignal) => Promise<T>,
  key: string,
  periodMs: number,
): Polled<T> {
  const [state, setState] = useState<{
    key: string;
    data?: T;
    error?: ApiError;
    updatedAt?: number;
  }>({ key });
  const readRef = useRef(read);
  readRef.current = read;
  const kick = useRef<() => void>(() => {});

  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    let controller: AbortController | undefined;
    setState((s) => (s.key === key ? s : { key }));

    const once = async () => {
      window.clearTimeout(timer);
      timer = undefined;
      if (stopped) return;
      if (document.hidden) return; // visibilitychange starts it again
      controller?.abort();
      controller = new AbortController();
      try {
        const data = await readRef.current(controller.signal);
        if (stopped) return;
        setState({ key, data, error: undefined, updatedAt: Date.now() });
      } catch (e) {
        if (stopped || (e instanceof DOMException && e.name === "AbortError")) return;
        const error =
          e instanceof ApiError ? e : new ApiError(0, "client", e instanceof Error ? e.message : String(e));
        setState((s) => ({ ...s, key, error }));
      }
      if (!stopped && !document.hidden) timer = window.setTimeout(once, periodMs);
    };
    const visibility = () => {
      if (!document.hidden && timer === undefined) void once();
    };
    kick.current = () => void once();
    document.addEventListener("visibilitychange", visibility);
    void once();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
      controller?.abort();
      document.removeEventListener("visibilitychange", visibility);
    };
  }, [key, periodMs]);

  const refresh = useCallback(() => kick.current(), []);
  const current = state.key === key ? state : { key };
  return { data: current.data, error: current.error, updatedAt: current.updatedAt, refresh };
}

/** The gateway's time, ticking every second while `running`. */
export function useTick(running: boolean): number {
  const [now, setNow] = useState(serverNow);
  useEffect(() => {
    setNow(serverNow());
    if (!running) return;
    const timer = window.setInterval(() => setNow(serverNow()), 1000);
    return () => window.clearInterval(timer);
  }, [running]);
  return now;
}
