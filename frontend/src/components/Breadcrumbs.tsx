import { Link } from 'react-router';

export function filesHref(path: string): string {
  const p = path.replace(/^\/+/, '');
  return p ? `/files/${p.split('/').map(encodeURIComponent).join('/')}` : '/files';
}

/** The path as links, root first. */
export function Breadcrumbs({ path }: { path: string }) {
  const parts = path.split('/').filter(Boolean);
  return (
    <nav aria-label="Breadcrumb" className="breadcrumbs">
      <ol>
        <li>
          <Link to="/files" aria-current={parts.length === 0 ? 'page' : undefined}>
            /
          </Link>
        </li>
        {parts.map((p, i) => {
          const sub = '/' + parts.slice(0, i + 1).join('/');
          return (
            <li key={sub}>
              <Link to={filesHref(sub)} aria-current={i === parts.length - 1 ? 'page' : undefined}>
                {p}
              </Link>
            </li>
          );
        })}
      </ol>
    </nav>
  );
}
