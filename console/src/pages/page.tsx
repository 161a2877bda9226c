// What every page gets, and its heading.

import type { ComponentChildren } from "preact";
import { useEffect, useRef } from "preact/hooks";

import type { Identity } from "../auth";
import type { Location } from "../router";

export interface PageProps {
  token: string;
  identity: Identity;
  location: Location;
}

/**
 * The page's one h1. It takes focus when the page is opened, so that a
 * screen reader announces where a link led.
 */
export function PageHeading(props: { title: ComponentChildren; children?: ComponentChildren }) {
  const ref = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    const active = document.activeElement;
    if (!active || active === document.body || !active.isConnected || active.tagName === "A") {
      ref.current?.focus({ preventScroll: true });
    }
  }, []);
  return (
    <div class="page-head">
      <h1 ref={ref} tabIndex={-1}>
        {props.title}
      </h1>
      {props.children ? <div class="page-head-extra">{props.children}</div> : null}
    </div>
  );
}

/** Where the path leads nowhere. */
export function NotFound() {
  return (
    <PageHeading title="No such page">
      <span>This console has no page here.</span>
    </PageHeading>
  );
}
