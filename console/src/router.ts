// Client-side navigation under /console/. A page is a path below the base
// (`sessions`) and its query (`?tenant=acme`): ids go in the query, where
// any character they hold survives. The gateway answers every such path
// with index.html.

import { useEffect, useState } from "preact/hooks";

export const BASE = import.meta.env.BASE_URL; // "/console/"

export interface Location {
  /** The path below the base, without slashes at either end: "" for the start page. */
  page: string;
  params: URLSearchParams;
}

function current(): Location {
  const path = window.location.pathname;
  const below = path.startsWith(BASE) ? path.slice(BASE.length) : "";
  return {
    page: below.replace(/^\/+|\/+$/g, ""),
    params: new URLSearchParams(window.location.search),
  };
}

const listeners = new Set<() => void>();

/**
 * Whether the operator has moved within the console (a link, back or
 * forward, signing in or out) since the page loaded: headings take the
 * focus then, not on the first load.
 */
let moved = false;

export function noteMove(): void {
  moved = true;
}

export function hasMoved(): boolean {
  return moved;
}

/** The URL of a page. */
export function href(
  page: string,
  params: Record<string, string | undefined | null> = {},
): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value) search.set(name, value);
  }
  const text = search.toString();
  return BASE + page + (text ? `?${text}` : "");
}

export function navigate(url: string, replace = false): void {
  if (replace) window.history.replaceState(null, "", url);
  else window.history.pushState(null, "", url);
  moved = true;
  for (const listener of listeners) listener();
}

export function useLocation(): Location {
  const [location, setLocation] = useState(current);
  useEffect(() => {
    const update = () => setLocation(current());
    const popped = () => {
      moved = true;
      update();
    };
    listeners.add(update);
    window.addEventListener("popstate", popped);
    return () => {
      listeners.delete(update);
      window.removeEventListener("popstate", popped);
    };
  }, []);
  return location;
}

/** Follows a plain click on an in-console link without reloading the page. */
export function followLink(event: MouseEvent): void {
  if (event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const target = event.currentTarget as HTMLAnchorElement;
  if (target.target || !target.href.startsWith(window.location.origin + BASE)) return;
  event.preventDefault();
  navigate(target.href);
}
