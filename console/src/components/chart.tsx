// A bar chart drawn as inline SVG: per day (or upstream, or model) a
// stacked bar of the tokens spent, by where they were spent, and beside it
// a bar of the tokens returned into callers' contexts. An image to
// assistive technology, named by a summary of its numbers; the page gives
// the same numbers in a table.

import { count } from "../time";

export interface Series {
  key: string;
  label: string;
  /** For a table's column. */
  short: string;
}

export interface Group {
  key: string;
  /** Short, for the axis. */
  label: string;
  /** One value per stacked series, in the order of `stacked`. */
  values: number[];
  /** The bar beside the stack, when the chart has one. */
  beside?: number;
}

// Drawn about as wide as it is shown beside its table on a laptop screen,
// so that its text is shown at about the size it is drawn.
const W = 780;
const H = 230;
const M = { top: 12, right: 8, bottom: 30, left: 52 };
const compact = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });

/**
 * The top of the axis, the smallest 1, 2, 2.5 or 5 times a power of ten at
 * or above `n`, and how many steps divide it into round numbers.
 */
function axis(n: number): { top: number; steps: number } {
  if (n <= 0) return { top: 4, steps: 4 };
  const power = 10 ** Math.floor(Math.log10(n));
  for (const [lead, steps] of [
    [1, 4],
    [2, 4],
    [2.5, 5],
    [5, 5],
  ] as const) {
    if (lead * power >= n) return { top: lead * power, steps };
  }
  return { top: 10 * power, steps: 5 };
}

export function BarChart(props: {
  label: string;
  stacked: Series[];
  beside?: Series;
  groups: Group[];
}) {
  const { stacked, beside, groups } = props;
  const pw = W - M.left - M.right;
  const ph = H - M.top - M.bottom;
  const highest = Math.max(
    0,
    ...groups.map((g) => Math.max(g.values.reduce((a, b) => a + b, 0), g.beside ?? 0)),
  );
  const { top, steps } = axis(highest);
  const y = (v: number) => M.top + ph - (v / top) * ph;
  const height = (v: number) => (v <= 0 ? 0 : Math.max(1.5, (v / top) * ph));
  const n = Math.max(1, groups.length);
  const gw = pw / n;
  const bars = beside ? 2 : 1;
  const bw = Math.max(1, Math.min(beside ? 26 : 40, (gw * 0.7) / bars));
  const every = Math.ceil(n / 12);
  const ticks = Array.from({ length: steps + 1 }, (_, i) => (i * top) / steps);

  return (
    <div class="chart">
      <ul class="legend" aria-hidden="true">
        {stacked.map((s) => (
          <li key={s.key}>
            <span class={`swatch s-${s.key}`} /> {s.label}
          </li>
        ))}
        {beside ? (
          <li>
            <span class={`swatch s-${beside.key}`} /> {beside.label}
          </li>
        ) : null}
      </ul>
      <svg
        class="chart-svg"
        viewBox={`0 0 ${W} ${H}`}
        role="img"
        aria-label={props.label}
        xmlns="http://www.w3.org/2000/svg"
      >
        {ticks.map((t) => (
          <g key={t} class="tick">
            <line x1={M.left} x2={W - M.right} y1={y(t)} y2={y(t)} class={t === 0 ? "axis" : "grid"} />
            <text x={M.left - 8} y={y(t)} dy="0.32em" text-anchor="end">
              {compact.format(t)}
            </text>
          </g>
        ))}
        {groups.map((g, i) => {
          const x0 = M.left + i * gw + (gw - bw * bars - (bars - 1) * 2) / 2;
          let base = 0;
          const spent = g.values.reduce((a, b) => a + b, 0);
          const words = [
            ...stacked.map((s, j) => `${s.label}: ${count(g.values[j] ?? 0)}`),
            ...(beside ? [`${beside.label}: ${count(g.beside ?? 0)}`] : []),
          ].join("; ");
          return (
            <g key={g.key} class="group">
              <title>{`${g.key}: ${count(spent)} tokens spent. ${words}`}</title>
              {stacked.map((s, j) => {
                const v = g.values[j] ?? 0;
                if (v <= 0) return null;
                const h = height(v);
                const rect = (
                  <rect
                    key={s.key}
                    class={`seg s-${s.key}`}
                    x={x0}
                    y={y(base) - h}
                    width={bw}
                    height={h}
                  />
                );
                base += v;
                return rect;
              })}
              {beside && (g.beside ?? 0) > 0 ? (
                <rect
                  class={`seg s-${beside.key}`}
                  x={x0 + bw + 2}
                  y={y(0) - height(g.beside ?? 0)}
                  width={bw}
                  height={height(g.beside ?? 0)}
                />
              ) : null}
              {i % every === 0 ? (
                <text class="x-label" x={M.left + i * gw + gw / 2} y={H - M.bottom + 18} text-anchor="middle">
                  {g.label}
                </text>
              ) : null}
            </g>
          );
        })}
        {highest === 0 ? (
          <text class="chart-empty" x={M.left + pw / 2} y={M.top + ph / 2} text-anchor="middle">
            No tokens in this span
          </text>
        ) : null}
      </svg>
    </div>
  );
}
