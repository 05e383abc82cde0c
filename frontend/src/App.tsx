import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { createBrowserRouter, RouterProvider, type RouteObject } from 'react-router';
import { ApiError } from './api/client';
import { AuthProvider } from './auth/AuthProvider';
import { Layout } from './components/Layout';
import { ActionView, ActionsView } from './routes/ActionView';
import { Events } from './routes/Events';
import { Files } from './routes/Files';
import { FileView } from './routes/FileView';
import { JobView } from './routes/JobView';
import { Jobs } from './routes/Jobs';
import { NodeView } from './routes/NodeView';
import { NotFound } from './routes/NotFound';
import { Overview } from './routes/Overview';
import { Policies } from './routes/Policies';
import { RequireAuth } from './routes/RequireAuth';
import { SignIn } from './routes/SignIn';
import { Throughput } from './routes/Throughput';

export const routes: RouteObject[] = [
  { path: '/signin', element: <SignIn /> },
  {
    element: <RequireAuth />,
    children: [
      {
        element: <Layout />,
        children: [
          { index: true, element: <Overview /> },
          { path: 'nodes/:nodeId', element: <NodeView /> },
          { path: 'throughput', element: <Throughput /> },
          { path: 'files/*', element: <Files /> },
          { path: 'file/*', element: <FileView /> },
          { path: 'actions', element: <ActionsView /> },
          { path: 'actions/:actionId', element: <ActionView /> },
          { path: 'policies', element: <Policies /> },
          { path: 'policies/:nodeId', element: <Policies /> },
          { path: 'events', element: <Events /> },
          { path: 'jobs', element: <Jobs /> },
          { path: 'jobs/:manifestId', element: <JobView /> },
          { path: '*', element: <NotFound /> },
        ],
      },
    ],
  },
];

export function makeQueryClient() {
  return new QueryClient({
    defaultOptions: {
      queries: {
        staleTime: 2_000,
        retry: (n, e) => !(e instanceof ApiError && [401, 403, 404, 422].includes(e.status)) && n < 3,
        retryDelay: (n) => Math.min(1000 * 2 ** n, 10_000),
      },
    },
  });
}

const router = createBrowserRouter(routes);
const queryClient = makeQueryClient();

export function App() {
  return (
    <QueryClientProvider client={queryClient}>
      <AuthProvider>
        <RouterProvider router={router} />
      </AuthProvider>
    </QueryClientProvider>
  );
}
