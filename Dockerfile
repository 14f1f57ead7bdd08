# The example worker (cmd/example-worker), built in a Go image and run from
# a distroless one. docker-compose.yml builds it; docs/docker.md shows how.
#
#   docker build -t oncemill-example-worker .
#   docker run --rm oncemill-example-worker --help
FROM golang:1.26 AS build
WORKDIR /src
# The worker is in the cmd module (cmd/go.mod), which requires the library
# at the root; go.work puts them together.
COPY go.mod go.sum ./
COPY cmd/go.mod cmd/go.sum ./cmd/
RUN cd cmd && GOWORK=off go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/example-worker ./cmd/example-worker

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/example-worker /example-worker
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/example-worker"]
CMD ["--mode=consume"]
