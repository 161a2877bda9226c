import { admin } from "../api";
import { ErrorNote, Freshness, Link } from "../components/ui";
import { usePoll } from "../poll";
import { href } from "../router";
import { count } from "../time";
import type { PageProps } from "./page";
import { PageHeading } from "./page";

const PERIOD = 5000;

export function Tenants({ token }: PageProps) {
  const tenants = usePoll((signal) => admin.tenants(token, signal), "tenants", PERIOD);
  const list = tenants.data?.tenants;
  return (
    <>
      <PageHeading title="Tenants">
        <Freshness updatedAt={tenants.updatedAt} periodMs={PERIOD} failing={Boolean(tenants.error)} />
      </PageHeading>
      <ErrorNote error={tenants.error} context="Could not read the tenants" />
      {list && list.length === 0 ? (
        <p class="empty">No tenant has had a branch yet.</p>
      ) : null}
      {list && list.length > 0 ? (
        <div class="table-wrap compact">
          <table class="compact">
            <caption class="visually-hidden">Tenants with their activity</caption>
            <thead>
              <tr>
                <th scope="col">Tenant</th>
                <th scope="col" class="num">Open sessions</th>
                <th scope="col" class="num">Active branches</th>
                <th scope="col" class="num">Tokens today (UTC)</th>
                <th scope="col">Limits, usage and changes</th>
              </tr>
            </thead>
            <tbody>
              {list.map((t) => (
                <tr key={t.tenant}>
                  <th scope="row">
                    <Link href={href("sessions", { tenant: t.tenant })}>{t.tenant}</Link>
                  </th>
                  <td class="num">{count(t.open_sessions)}</td>
                  <td class="num">{count(t.active_branches)}</td>
                  <td class="num">{count(t.tokens_today)}</td>
                  <td class="links">
                    <Link href={href("limits", { tenant: t.tenant })}>
                      Limits<span class="visually-hidden"> of {t.tenant}</span>
                    </Link>
                    <Link href={href("usage", { tenant: t.tenant })}>
                      Usage<span class="visually-hidden"> of {t.tenant}</span>
                    </Link>
                    <Link href={href("audit", { tenant: t.tenant })}>
                      Changes<span class="visually-hidden"> to {t.tenant}</span>
                    </Link>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
    </>
  );
}
