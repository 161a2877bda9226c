// Small pieces every page uses.

import type { ComponentChildren } from "preact";
import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";

import type { ApiError, Budget } from "../api";
import { followLink, href } from "../router";
import { count } from "../time";

export function Link(props: { href: string; children: ComponentChildren; class?: string; current?: boolean }) {
  return (
    <a
      href={props.href}
      class={props.class}
      onClick={followLink}
      aria-current={props.current ? "page" : undefined}
    >
      {props.children}
    </a>
  );
}

/** A branch's or session's status, in words and colour. */
export function Status(props: { status: string; reason?: string | null }) {
  return (
    <span class={`status status-${props.status}`}>
      {props.status}
      {props.reason ? <span class="reason"> · {props.reason}</span> : null}
    </span>
  );
}

/**
 * A token pool as a bar: spent, lent to active children, and free, with
 * the numbers written out beside it.
 */
export function BudgetBar(props: { budget: Budget; label?: string }) {
  const { total, used, reserved } = props.budget;
  const pct = (n: number) => (total > 0 ? Math.min(100, (n / total) * 100) : 0);
  const usedPct = pct(used);
  const reservedPct = Math.min(100 - usedPct, pct(reserved));
  const words = `${count(used)} used, ${count(reserved)} reserved, of ${count(total)} tokens`;
  return (
    <div class="budget">
      <div
        class="bar"
        role="img"
        aria-label={`${props.label ?? "Budget"}: ${words}`}
      >
        <span class="bar-used" style={{ width: `${usedPct}%` }} />
        <span class="bar-reserved" style={{ width: `${reservedPct}%` }} />
      </div>
      <span class="budget-text" aria-hidden="true">
        <b>{count(used)}</b> used · {count(reserved)} reserved · {count(total)} total
      </span>
    </div>
  );
}

export function ErrorNote(props: { error: ApiError | undefined; context?: string }) {
  if (!props.error) return null;
  return (
    <p class="note note-error" role="alert">
      {props.context ? `${props.context}: ` : ""}
      {props.error.describe()}
    </p>
  );
}

/**
 * A button for a change that cannot be undone: the first press asks, the
 * second does it. Escape or Cancel steps back.
 */
export function ConfirmButton(props: {
  label: ComponentChildren;
  question: string;
  confirmLabel: string;
  /** Shown on the confirming button while the change is made. */
  busyLabel?: string;
  onConfirm: () => Promise<void>;
}) {
  const [stage, setStage] = useState<"idle" | "asking" | "busy">("idle");
  const first = useRef<HTMLButtonElement>(null);
  const cancel = useRef<HTMLButtonElement>(null);
  const returnFocus = useRef(false);

  // Before the browser paints: the focused button was just replaced.
  useLayoutEffect(() => {
    if (stage === "asking") cancel.current?.focus();
    if (stage === "idle" && returnFocus.current) {
      returnFocus.current = false;
      first.current?.focus();
    }
  }, [stage]);

  if (stage === "idle") {
    return (
      <button type="button" class="danger" ref={first} onClick={() => setStage("asking")}>
        {props.label}
      </button>
    );
  }
  const back = () => {
    returnFocus.current = true;
    setStage("idle");
  };
  return (
    <span
      class="confirm"
      role="group"
      aria-label={props.question}
      onKeyDown={(e) => {
        if (e.key === "Escape" && stage === "asking") back();
      }}
    >
      <span class="confirm-question">{props.question}</span>
      <button
        type="button"
        class="danger solid"
        disabled={stage === "busy"}
        onClick={async () => {
          setStage("busy");
          try {
            await props.onConfirm();
          } finally {
            setStage("idle");
          }
        }}
      >
        {stage === "busy" ? (props.busyLabel ?? "Ending…") : props.confirmLabel}
      </button>
      <button type="button" ref={cancel} disabled={stage === "busy"} onClick={back}>
        Cancel
      </button>
    </span>
  );
}

/** A notice after an action: what it did, or why it failed. Focused when shown. */
export function Notice(props: { notice: { text: string; error: boolean; id: number } | null }) {
  const ref = useRef<HTMLParagraphElement>(null);
  useEffect(() => {
    if (props.notice) ref.current?.focus();
  }, [props.notice?.id]);
  if (!props.notice) return null;
  return (
    <p
      ref={ref}
      tabIndex={-1}
      class={`note ${props.notice.error ? "note-error" : "note-ok"}`}
      role={props.notice.error ? "alert" : "status"}
    >
      {props.notice.text}
    </p>
  );
}

/** Says when the data shown was read, and that it refreshes. */
export function Freshness(props: {
  updatedAt: number | undefined;
  periodMs: number;
  failing?: boolean;
}) {
  if (!props.updatedAt) {
    return (
      <span class="freshness">
        {props.failing ? `Trying again every ${props.periodMs / 1000} s` : "Loading…"}
      </span>
    );
  }
  const time = new Date(props.updatedAt).toLocaleTimeString("en-GB", { hour12: false });
  return (
    <span class="freshness">
      Updated {time}; refreshes every {props.periodMs / 1000} s
    </span>
  );
}

/**
 * What has been spent of a quota, as a bar with the numbers written out;
 * without a quota, the spending alone.
 */
export function QuotaBar(props: { label: string; spent: number; quota: number | null }) {
  const { spent, quota } = props;
  if (quota === null) {
    return (
      <div class="quota">
        <span class="quota-text">
          <b>{count(spent)}</b> spent · no quota
        </span>
      </div>
    );
  }
  const share = quota > 0 ? spent / quota : 0;
  const over = spent >= quota;
  const percent = Math.round(share * 100);
  const words = `${count(spent)} of ${count(quota)} tokens spent (${percent}%)${over ? ", quota reached" : ""}`;
  return (
    <div class="quota">
      <div class={`bar quota-bar${over ? " quota-over" : ""}`} role="img" aria-label={`${props.label}: ${words}`}>
        <span class="bar-used" style={{ width: `${Math.min(100, share * 100)}%` }} />
      </div>
      <span class="quota-text" aria-hidden="true">
        <b>{count(spent)}</b> of {count(quota)} ({percent}%){over ? " · quota reached" : ""}
      </span>
    </div>
  );
}

/** The pages of one tenant, as tabs under its heading's breadcrumb. */
export function TenantNav(props: { tenant: string; current: "sessions" | "limits" | "usage" | "audit" }) {
  const { tenant, current } = props;
  const tabs: [string, string, string][] = [
    ["sessions", "Sessions", href("sessions", { tenant })],
    ["limits", "Limits", href("limits", { tenant })],
    ["usage", "Usage", href("usage", { tenant })],
    ["audit", "Changes", href("audit", { tenant })],
  ];
  return (
    <nav aria-label={`Tenant ${tenant}`} class="tabs">
      {tabs.map(([page, label, to]) => (
        <Link key={page} href={to} current={page === current}>
          {label}
        </Link>
      ))}
    </nav>
  );
}

/** The breadcrumb of a tenant's page: Tenants › tenant › page. */
export function TenantCrumbs(props: { tenant: string; page?: string }) {
  return (
    <nav aria-label="Breadcrumb" class="crumbs">
      <Link href={href("")}>Tenants</Link> <span aria-hidden="true">›</span>{" "}
      {props.page ? (
        <>
          <Link href={href("sessions", { tenant: props.tenant })}>{props.tenant}</Link>{" "}
          <span aria-hidden="true">›</span> {props.page}
        </>
      ) : (
        props.tenant
      )}
    </nav>
  );
}
