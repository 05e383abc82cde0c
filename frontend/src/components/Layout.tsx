import { NavLink, Outlet } from 'react-router';
import { useAuth } from '../auth/auth';
import { useLiveState } from '../api/live';
import { useTheme } from '../theme';

const LIVE_TEXT = { connecting: 'connecting…', open: 'live', reconnecting: 'reconnecting…', unauthorized: 'refused' } as const;

export function Layout() {
  const { whoami, signOut } = useAuth();
  const live = useLiveState();
  const [theme, setTheme] = useTheme();
  return (
    <div className="app">
      <a className="skip" href="#main">
        Skip to content
      </a>
      <header className="topbar">
        <span className="brand">HyCache</span>
        <nav aria-label="Main">
          <ul>
            <li><NavLink to="/" end>Overview</NavLink></li>
            <li><NavLink to="/throughput">Throughput</NavLink></li>
            <li><NavLink to="/files">Files</NavLink></li>
            <li><NavLink to="/policies">Policies</NavLink></li>
            <li><NavLink to="/events">Events</NavLink></li>
            <li><NavLink to="/jobs">Jobs</NavLink></li>
          </ul>
        </nav>
        <div className="topbar-right">
          <span className={`live live-${live}`} role="status" aria-label={`Live stream ${LIVE_TEXT[live]}`}>
            ● {LIVE_TEXT[live]}
          </span>
          <button type="button" onClick={() => setTheme(theme === 'dark' ? 'light' : 'dark')} aria-label={`Switch to ${theme === 'dark' ? 'light' : 'dark'} theme`}>
            {theme === 'dark' ? '☀' : '☾'}
          </button>
          {whoami && (
            <span className="small" aria-label="Signed in as">
              {whoami.name} ({whoami.scope === 'admin' ? 'admin' : 'read-only'})
            </span>
          )}
          <button type="button" onClick={signOut}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        <Outlet />
      </main>
    </div>
  );
}
