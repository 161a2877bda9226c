// What every page gets, and its heading.

import type { ComponentChildren } from "preact";
import { useEffect, useRef } from "preact/hooks";

import type { Identity } from "../auth";
import { BASE, hasMoved, type Location } from "../router";

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
    if (hasMoved()) ref.current?.focus({ preventScroll: true });
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
    <>
      <PageHeading title="No such page" />
      <p>
        This console has no page here. <a href={BASE}>Go to the tenants.</a>
      </p>
    </>
  );
}
