import { Navigate, Outlet, useLocation } from 'react-router';
import { useAuth } from '../auth/auth';
import { LiveProvider } from '../api/LiveProvider';

export function RequireAuth() {
  const { token } = useAuth();
  const loc = useLocation();
  if (!token) return <Navigate to="/signin" replace state={{ from: loc.pathname + loc.search }} />;
  return (
    <LiveProvider token={token}>
      <Outlet />
    </LiveProvider>
  );
}
