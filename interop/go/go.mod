module sluice/interop

go 1.22

require github.com/rabbitmq/amqp091-go v1.10.0
